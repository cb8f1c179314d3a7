"""Fakes and the whole-system simulation: the only part of provisionerd that may import ``refcontroller``."""
