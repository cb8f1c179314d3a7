"""Frozen values shared by every layer, and the typed error hierarchy. Pure: no I/O, no trio."""
