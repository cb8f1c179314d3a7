"""The pure orphan classifier: detection, gates, policy and the report. No trio, no I/O."""
