"""``provisionerd demo``: the whole system on this host."""
