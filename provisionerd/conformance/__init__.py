"""``provisionerd controller check``: the conformance kit for controller implementers (docs/controllers.md)."""
