"""The schemas the package ships (the plugin contract's and the daemon config's) are checked against their
metaschema here, once per test run, instead of at the start of every process that validates a call or reads a
config (0.16 s of CPU a daemon start). A schema from another directory is still checked at load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest

from provisionerd.config.problems import SCHEMA_PATH as CONFIG_SCHEMA
from provisionerd.provider.schemas import SCHEMA_DIR, ContractSchemas

SHIPPED = sorted(SCHEMA_DIR.glob("*.json"))


def test_the_contract_ships_its_schemas() -> None:
    assert len(SHIPPED) >= 20 and all(p.name.endswith(".json") for p in SHIPPED)


@pytest.mark.parametrize("path", [*SHIPPED, Path(str(CONFIG_SCHEMA))], ids=lambda p: p.name)
def test_every_shipped_schema_is_valid_under_its_metaschema(path: Path) -> None:
    document = json.loads(path.read_text(encoding="utf-8"))
    jsonschema.validators.validator_for(document).check_schema(document)


def test_a_broken_schema_in_another_directory_is_refused_at_load(tmp_path: Path) -> None:
    directory = tmp_path / "schemas"
    shutil.copytree(SCHEMA_DIR, directory)
    path = directory / "getRequestStatus.output.json"
    document = json.loads(path.read_text())
    document["minProperties"] = "three"  # not a number: the metaschema refuses it
    path.write_text(json.dumps(document))
    with pytest.raises(jsonschema.SchemaError):
        ContractSchemas(directory)
