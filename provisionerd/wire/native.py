"""The optional native reader of frame bodies (``rust/fastwire``, built into ``provisionerd.wire._fastwire``).

``codec.decode`` uses it when it is there: it reads a frame body straight into the attrs message, from plans that
``codec`` compiles out of the schema and the classes, about 4x faster than the reference path through pycapnp.
It never decides alone: whatever it does not accept (malformed input, a cap or budget exceeded, a layout it does
not read) it hands back, and the reference codec decodes the frame and gives the answer, value or typed error.

``PROVISIONERD_NATIVE_CODEC=0`` in the environment turns it off (the reference path alone, as without the build).
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

log = logging.getLogger(__name__)

#: The environment variable that turns the native reader off when set to ``0``.
SWITCH = "PROVISIONERD_NATIVE_CODEC"
#: The shape of the plans ``codec`` hands the extension (``PLAN_VERSION`` in rust/fastwire/src/lib.rs).
PLAN_VERSION = 6


def load() -> ModuleType | None:
    """The extension module, or None when it is not built (a checkout without Rust), switched off, or built from
    other sources than these (``PLAN_VERSION``; logged)."""
    if os.environ.get(SWITCH, "1") == "0":
        return None
    try:
        module = importlib.import_module("provisionerd.wire._fastwire")
    except ImportError:
        return None
    if getattr(module, "PLAN_VERSION", None) != PLAN_VERSION:  # built from other sources than these: rebuild it
        log.warning(
            "native codec not used: stale build",
            extra={"built": getattr(module, "PLAN_VERSION", None), "expected": PLAN_VERSION, "path": module.__file__},
        )
        return None
    return module
