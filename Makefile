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
	@echo "OP2's Airfoil on OP2's 720000-cell NACA0012 validation mesh, 1000 iterations (about a minute):"
	$(BIN)/python examples/airfoil.py --timing
	@echo "OP2's published rms at iteration 1000 for this mesh: 1.060114637578e-04"

test: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python benchmarks/airfoil_vs_c.py

clean:
	rm -rf $(VENV) build benchmarks/build .pytest_cache .hypothesis .meshchain-cache
