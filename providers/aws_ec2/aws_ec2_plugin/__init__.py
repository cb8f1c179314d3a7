"""The provisionerd EC2 provider plugin (boto3). See ``providers/aws_ec2/README.md``."""

__version__ = "0.1.0"
