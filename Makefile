# Each target creates .venv and installs what it needs when missing, so both work on a fresh machine.
PY ?= python3
VENV := .venv
# Two stamps: the demo needs only the runtime dependencies (a fresh machine reaches the demo in seconds), the
# tests also need pytest, hypothesis, boto3 and moto.
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed-test

.PHONY: demo test bench simulate clean

$(VENV)/bin/python:
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip

$(RUN_STAMP): pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/pip install -q -e .
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $(RUN_STAMP) $(STAMP)

demo: $(RUN_STAMP)
	$(VENV)/bin/provisionerd demo

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q

# The CI fault campaign (docs/simulation.md): 500 seeded whole-system simulations, both workloads.
simulate: $(STAMP)
	$(VENV)/bin/provisionerd simulate --seeds 500 --jobs 2

bench: $(STAMP)
	$(VENV)/bin/python bench/providers.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
