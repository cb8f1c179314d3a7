"""What the EC2 tests share besides fixtures: where things are, the fake credentials, reading an instance back."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PLUGIN_DIR = REPO / "providers" / "aws_ec2"
SCHEMAS = REPO / "schemas"

REGION = "us-east-1"
# Recognisable fakes: if any of these shows up in plugin output, a secret leaked.
ACCESS_KEY = "AKIAFAKELEAKCHECK0001"
SECRET_KEY = "fAkE/SeCrEt+KeY-must-never-appear-0123456789"
SESSION_TOKEN = "FakeSessionToken-must-never-appear-9876543210"
IMAGE = "ami-0123456789abcdef0"


def credentials_env(home: Path) -> dict[str, str]:
    """The plugin's AWS environment: the fake credentials (the leak checks look for them) and nothing from this
    host (no config or credentials file, no instance metadata)."""
    return {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_SESSION_TOKEN": SESSION_TOKEN,
        "AWS_CONFIG_FILE": str(home / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def user_data(ec2: Any, instance_id: str) -> dict[str, Any]:
    value = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")["UserData"]["Value"]
    return json.loads(base64.b64decode(value))


def tags_of(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


def shutdown_behaviour(ec2: Any, instance_id: str) -> str:
    """The instance's InstanceInitiatedShutdownBehavior (``terminate`` or ``stop``), as EC2 holds it."""
    reply = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="instanceInitiatedShutdownBehavior")
    return str(reply["InstanceInitiatedShutdownBehavior"]["Value"])
