# Each target creates .venv and installs what it needs when missing, so both work on a fresh machine.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test bench simulate clean

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/provisionerd demo

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q

# The CI fault campaign (docs/simulation.md): 500 seeded whole-system simulations. Gate runs only until the
# lifecycle findings in tests/simulation/test_regressions.py are fixed; then drop --workload (both workloads).
simulate: $(STAMP)
	$(VENV)/bin/provisionerd simulate --seeds 500 --jobs 2 --workload gate

bench: $(STAMP)
	$(VENV)/bin/python bench/providers.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
