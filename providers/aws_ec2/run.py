"""Entry point of the aws_ec2 provider plugin: ``run.py oneshot <action> -f in.json`` or ``run.py persistent``.

Run it with the project's interpreter (``$PROVISIONERD_PYTHON``, else ``python3``); it needs boto3, attrs,
jsonschema and the plugin SDK (``provisionerd.plugin_sdk``). The wrappers next to this file (``<action>.sh``,
``provider``) are what the daemon starts. Persistent: up to 8 calls in flight in threads, one boto3 client shared
(botocore supports that).
"""

import os
import sys

# The provisionerd that ships this plugin: the checkout (providers/aws_ec2) or the wheel's site-packages
# (provisionerd/resources/providers/aws_ec2), ahead of any other on the path.
HERE = os.path.dirname(os.path.realpath(__file__))
ROOTS = (f"{HERE}/../..", f"{HERE}/../../../..")
sys.path[1:1] = [root for root in ROOTS if os.path.isdir(f"{root}/provisionerd/plugin_sdk")][:1]

if __name__ == "__main__":
    from aws_ec2_plugin.plugin import Plugin
    from aws_ec2_plugin.redact import Redactor

    from provisionerd.plugin_sdk.entry import main

    redactor = Redactor.from_environment()
    sys.exit(main(lambda: Plugin.from_environment(redactor), sys.argv[1:], "aws_ec2", redactor))
