"""Entry point of the aws_ec2 provider plugin: ``run.py oneshot <action> -f in.json`` or ``run.py persistent``.

Run it with the project's interpreter (``$PROVISIONERD_PYTHON``, else ``python3``); it needs boto3, trio, attrs and
jsonschema. The wrappers next to this file (``<action>.sh``, ``provider``) are what the daemon starts.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["persistent"] and len(args) == 1:
        from aws_ec2_plugin import persistent

        sys.exit(persistent.main())
    if args[:1] == ["oneshot"] and len(args) >= 2:
        from aws_ec2_plugin import oneshot  # without trio: a one-shot call imports only what it needs

        sys.exit(oneshot.main(args[1], args[2:]))
    print("usage: run.py persistent | run.py oneshot <action> -f <input.json>", file=sys.stderr)
    sys.exit(2)
