"""The local provider: machines are worker-agent processes on this host (see providers/local/README.md)."""
