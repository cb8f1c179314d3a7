"""Make the helpers in this folder importable by the tests (pytest runs in importlib mode); a short directory for
unix sockets."""

import pathlib
import sys
from collections.abc import Iterator

import pytest
from rigs.daemon import short_dir

sys.path.insert(0, str(pathlib.Path(__file__).parent))


@pytest.fixture
def sock_dir() -> Iterator[pathlib.Path]:
    """A fresh directory under /tmp for an admin socket (a ``tmp_path`` may be too long for one), removed after."""
    with short_dir("pd-adm-") as path:
        yield path
