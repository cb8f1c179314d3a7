"""The simulated provider plugin: a deterministic, fault-injecting stand-in for a cloud (standard library only)."""
