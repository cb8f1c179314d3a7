"""Build the one boto3 EC2 client a plugin process uses.

Credentials come only from the standard chain (``profile`` names a profile, it holds no secret). Once resolved they
are handed to the redactor, so whatever boto3 found (shared files, SSO, role) is scrubbed from output, not only what
the environment held. botocore's own loggers stay at WARNING: at DEBUG they print request bodies, and a
RunInstances body carries UserData, hence join tokens.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import boto3
import botocore.config

from aws_ec2_plugin import faults
from aws_ec2_plugin.config import Config
from aws_ec2_plugin.redact import Redactor

for _name in ("boto3", "botocore", "urllib3", "s3transfer"):
    logging.getLogger(_name).setLevel(logging.WARNING)


def make_client(config: Config, redactor: Redactor) -> Any:
    """An EC2 client for ``config`` with bounded timeouts and botocore's 'standard' retry mode."""
    session = boto3.session.Session(profile_name=config.profile, region_name=config.region)
    redactor.add_credentials(session.get_credentials())
    client = session.client(
        "ec2",
        region_name=config.region,
        endpoint_url=config.endpoint_url,
        config=botocore.config.Config(
            retries={"mode": "standard", "total_max_attempts": config.max_attempts},  # counts the first
            connect_timeout=config.connect_timeout,
            read_timeout=config.read_timeout,
            user_agent_extra="provisionerd-aws_ec2",
        ),
    )
    if config.fault_injection:
        print(
            "aws_ec2: WARNING fault_injection is set: test-only EC2 faults are active in this process",
            file=sys.stderr,
            flush=True,
        )
        faults.install(client.meta.events, config.fault_injection)
    return client
