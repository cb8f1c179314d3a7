"""The conformance kit's own tests: the kit against the reference controller, and against broken variants of it."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from provisionerd.pki.certs import init_certs

    directory = tmp_path_factory.mktemp("certs")
    init_certs(directory, "kitcluster")
    return directory
