"""Make the helpers in this folder importable by the tests (pytest runs in importlib mode)."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
