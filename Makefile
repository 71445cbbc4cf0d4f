# Two entry points; both create or reuse .venv and install what they need from PyPI.
#   make demo   -- run the main job (Airfoil on a generated NACA0012 mesh)
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
	$(BIN)/python examples/airfoil.py --size 200 300 --iters 1000 --timing

test: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python benchmarks/airfoil_vs_c.py

clean:
	rm -rf $(VENV) build benchmarks/build .pytest_cache .hypothesis .meshchain-cache
