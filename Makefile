# Each target creates .venv and installs what it needs when missing, so both work on a fresh machine.
PY ?= python3
VENV := .venv
# Three stamps: the demo needs only the runtime dependencies (a fresh machine reaches the demo in seconds), the
# tests also need pytest, hypothesis, boto3 and moto, and the checks ruff, mypy and import-linter.
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed-test
LINT_STAMP := $(VENV)/.installed-lint
# The native codec's sources: an editable install builds it once, so a change to them must reinstall.
NATIVE := rust/fastwire/Cargo.toml rust/fastwire/Cargo.lock rust/fastwire/src/lib.rs
# cargo's build of the native codec is kept beside the other caches, so a second clone on this machine builds it in
# a second instead of 14. No bytecode is compiled at install time: pip would compile every installed module (botocore
# alone is thousands), Python compiles the few a run imports. Together a fresh clone installs in 18 s instead of 37.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/provisionerd/cargo-target
# mypy's incremental cache likewise (it checks each module's hash, so any clone may use it): a fresh clone's type
# check then reads what changed instead of all 283 files.
export MYPY_CACHE_DIR ?= $(HOME)/.cache/provisionerd/mypy
# Python writes the bytecode it compiles (modules and pytest's rewritten test modules) even where the environment
# says not to (PYTHONDONTWRITEBYTECODE, set on these machines): otherwise every test run, and every process a test
# starts, compiles all it imports again (collection alone went from 15 s to 4.6 s a run).
unexport PYTHONDONTWRITEBYTECODE
PIP_INSTALL := $(VENV)/bin/pip install -q --no-compile

.PHONY: demo test test-fast test-integration lint bench simulate clean

$(VENV)/bin/python:
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip

$(RUN_STAMP): pyproject.toml $(NATIVE) | $(VENV)/bin/python
	$(PIP_INSTALL) -e .
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml $(NATIVE) | $(VENV)/bin/python
	$(PIP_INSTALL) -e '.[test]'
	touch $(RUN_STAMP) $(STAMP)

$(LINT_STAMP): pyproject.toml $(NATIVE) | $(VENV)/bin/python
	$(PIP_INSTALL) -e '.[lint]'
	touch $(RUN_STAMP) $(LINT_STAMP)

demo: $(RUN_STAMP)
	$(VENV)/bin/provisionerd demo

# The test tiers (tests/conftest.py keeps them true: a test that starts a process unmarked fails).
# test: the README's test command, everything that needs only pip packages and the machine's Python (real processes
# of the project's own and moto included; no Go build, no apt package).
# Four workers on 2 cores: the real-process tests mostly wait on the real clock. Work stealing: each worker starts
# on its own quarter of the tests and an idle one takes half of what a busy one has left, so the run does not end on
# one worker's last batch (with the default scheduling the wheel's tests, last in the order, ran 70 s alone).
test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m "not integration" -n 4 --dist worksteal

# test-fast: the inner loop, pure and MockClock tests only (no process is started), less the sweeps (marker
# `sweep`: about 20 tests of over 2.5 s CPU each, 40% of the tier's CPU), which make test runs.
test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m "not process and not integration and not sweep" -n 2

# test-integration: Slurm, Kubernetes, etcd, the capnp tool, systemd-analyze and Node.js; installs or builds them
# once (cached) and says so while it builds. In CI a missing back end fails the test, never skips it.
# Two workers, work stealing: these tests mostly wait on the real clock (the tier used 0.6 of a core on average), and
# every back end a rig starts (Slurm, the Kubernetes control plane, etcd) takes free ports and a directory of its own,
# so each worker runs its own. 107 tests: 507 s on one worker, 282 s on two, measured the same hour.
test-integration: $(STAMP)
	.ci/integration-backends
	$(VENV)/bin/python -m pytest -q -m integration --durations=15 -n 2 --dist worksteal

# What CI checks before the tests, each at zero findings: lint, formatting, types, the layers of
# ../shared/DESIGN.md (import-linter, contracts in .importlinter), shellcheck on every shell script
# (.ci/shell-files), and rustfmt and clippy on the native codec where cargo is installed. Every check runs; any
# finding fails the target.
lint: $(LINT_STAMP)
	@status=0; \
	$(VENV)/bin/ruff check . || status=1; \
	$(VENV)/bin/ruff format --check . || status=1; \
	$(VENV)/bin/mypy || status=1; \
	$(VENV)/bin/lint-imports || status=1; \
	$(VENV)/bin/shellcheck -S warning $$(.ci/shell-files) || status=1; \
	if command -v cargo >/dev/null; then \
		cargo fmt --manifest-path rust/fastwire/Cargo.toml --check || status=1; \
		cargo clippy -q --release --manifest-path rust/fastwire/Cargo.toml -- -D warnings || status=1; \
	fi; \
	exit $$status

# The CI fault campaign (docs/simulation.md): the 500 fixed regression seeds, then 300 from a fresh random start
# (printed first, so a red run can be replayed: provisionerd simulate --seeds 300 --start START).
ifndef SIM_START
SIM_START := $(shell python3 -c 'import random; print(random.randrange(10**6, 10**9))')
endif
simulate: $(STAMP)
	$(VENV)/bin/provisionerd simulate --seeds 500 --jobs 2
	@echo "simulate: fresh random start $(SIM_START)"
	$(VENV)/bin/provisionerd simulate --seeds 300 --start $(SIM_START) --jobs 2

bench: $(STAMP)
	$(VENV)/bin/python bench/providers.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
