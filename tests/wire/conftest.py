"""Wire test setup: async tests run under ``trio.run`` (no pytest-trio here), and ``wire_strategies`` next to this
file is importable (importlib mode does not put test folders on ``sys.path``)."""

from __future__ import annotations

import functools
import inspect
import sys
from pathlib import Path

import pytest
import trio

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    trio.run(functools.partial(pyfuncitem.obj, **kwargs))
    return True


@pytest.fixture(scope="session")
def certs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cluster ``alpha``: CA + every role."""
    from provisionerd.pki.certs import init_certs

    directory = tmp_path_factory.mktemp("certs-alpha")
    init_certs(directory, "alpha")
    return directory


@pytest.fixture(scope="session")
def foreign_certs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same cluster name, another CA: what an attacker with their own CA would present."""
    from provisionerd.pki.certs import init_certs

    directory = tmp_path_factory.mktemp("certs-foreign")
    init_certs(directory, "alpha")
    return directory
