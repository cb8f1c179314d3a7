"""The wire layer: messages, their Cap'n Proto codec, length-prefixed framing, paging, mutual TLS and roles.

Specified in docs/protocol.md; the schema is protocol/provisioner.capnp.
"""
