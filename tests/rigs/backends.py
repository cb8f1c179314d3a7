"""What the integration tier needs beyond pip, found here or refused loudly.

``make test-integration`` runs ``.ci/integration-backends`` first, which installs the Debian packages and builds
(once, cached) the Kubernetes control plane and etcd. A test that finds its back end missing anyway fails in CI
(``CI=true``): no test skips silently there. Elsewhere it skips, naming what to install.
"""

from __future__ import annotations

import os
import shutil

import pytest

#: Where Debian puts daemons (slurmctld, munged) that a user's PATH may lack.
SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def in_ci() -> bool:
    return os.environ.get("CI") == "true"


def missing(message: str) -> None:
    """A back end is not there: fail in CI, skip elsewhere (``pytest.fail`` / ``pytest.skip`` raise)."""
    if in_ci():
        pytest.fail(f"{message} (CI=true: a missing back end is a failure; .ci/integration-backends installs it)")
    pytest.skip(f"{message} (make test-integration installs it)")


def need(tool: str, install: str) -> str:
    """The path of ``tool``; ``missing`` when it is not installed (``install`` says how to get it)."""
    path = shutil.which(tool, path=SBIN_PATH)
    if path is None:
        missing(f"{tool} is not installed ({install})")
        raise AssertionError("unreachable")  # pragma: no cover - missing() raised
    return path
