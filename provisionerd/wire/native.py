"""The optional native reader of frame bodies (``rust/fastwire``, built into ``provisionerd.wire._fastwire``).

``codec.decode`` uses it when it is there: it reads a frame body straight into the attrs message, from plans that
``codec`` compiles out of the schema and the classes, about 4x faster than the reference path through pycapnp.
It never decides alone: whatever it does not accept (malformed input, a cap or budget exceeded, a layout it does
not read) it hands back, and the reference codec decodes the frame and gives the answer, value or typed error.

``PROVISIONERD_NATIVE_CODEC=0`` in the environment turns it off (the reference path alone, as without the build).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

#: The environment variable that turns the native reader off when set to ``0``.
SWITCH = "PROVISIONERD_NATIVE_CODEC"


def load() -> ModuleType | None:
    """The extension module, or None when it is not built (a checkout without Rust) or switched off."""
    if os.environ.get(SWITCH, "1") == "0":
        return None
    try:
        return importlib.import_module("provisionerd.wire._fastwire")
    except ImportError:
        return None
