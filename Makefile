# The two commands a new user needs: `make demo` and `make test`.
# `make install` creates .venv when missing and installs the project with its
# extras the suite needs (all of them); a stamp file keeps it quick when pyproject.toml has not changed.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test test-fast unit integration demo bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,sim,train,serve,k8s,dashboard]'
	@touch $(STAMP)

# Two workers, one test module each at a time; each worker starts one Ray cluster, which its integration modules
# share (tests/integration/conftest.py): the tier mostly waits on Ray, so two modules side by side keep both cores
# busy. The 25 slowest tests are listed at the end, so a run says where its time went.
test: install
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=25

# The quick tier (under two minutes): everything that starts no Ray cluster and is not marked slow (the whole
# simulated days and the openb replays, seconds to a minute each). `make test` runs every test of both marks.
test-fast: install
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not ray and not slow" --ignore=tests/integration

unit: install
	$(BIN)/python -m pytest -q tests/unit

demo: install
	$(BIN)/orchestrator demo

bench: install
	$(BIN)/orchestrator bench placement --nodes 5000 --json

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
