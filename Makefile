# Two entry points; both create or reuse .venv and install what they need from PyPI.
#   make demo   -- run the main job: Airfoil, the synthetic and the vertex chain on 2 MPI ranks, loop by loop and
#                  communication-avoiding, checked equal, with the profitability table
#   make test   -- run the test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.meshchain-installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	MESHCHAIN_THREADS=1 $(BIN)/python -m meshchain demo

test: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python benchmarks/airfoil_vs_c.py

clean:
	rm -rf $(VENV) build benchmarks/build .pytest_cache .hypothesis .meshchain-cache
