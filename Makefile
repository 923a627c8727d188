# m27 — every target creates its own virtual environment on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
SRC     = m27 flows tests benchmarks examples

.PHONY: install example example-gromacs example-replicas example-lammps example-cp2k example-openmm test lint typecheck unit bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,examples]'
	touch $@

install: $(BIN)/.installed

## The main job: the molecular-dynamics example pipeline, embedded defaults, no GPU needed.
example: install
	$(BIN)/m27 run examples/md/pipeline.yaml

## The original pipeline with real GROMACS (apt-get install gromacs first): water box, mdrun, plots.
example-gromacs: install
	@command -v gmx >/dev/null || { echo "gmx not found: apt-get install gromacs" >&2; exit 1; }
	$(BIN)/m27 run examples/gromacs/pipeline.yaml

## Three replicas of it (matrix:), each with its own starting velocities, then compared.
example-replicas: install
	@command -v gmx >/dev/null || { echo "gmx not found: apt-get install gromacs" >&2; exit 1; }
	$(BIN)/m27 run examples/gromacs/replicas.yaml

## LAMMPS (apt-get install --no-install-recommends lammps first): a Lennard-Jones melt.
example-lammps: install
	@command -v lmp >/dev/null || { echo "lmp not found: apt-get install lammps" >&2; exit 1; }
	$(BIN)/m27 run examples/lammps/pipeline.yaml

## CP2K (apt-get install --no-install-recommends cp2k first): DFT dynamics of a water molecule.
example-cp2k: install
	@command -v cp2k >/dev/null || { echo "cp2k not found: apt-get install cp2k" >&2; exit 1; }
	$(BIN)/m27 run examples/cp2k/pipeline.yaml

## OpenMM as a Python library (installed by make install): a water box, m27.Checkpointer.
example-openmm: install
	$(BIN)/m27 run examples/openmm/pipeline.yaml

lint: install
	$(BIN)/ruff check $(SRC)
	$(BIN)/ruff format --check $(SRC)

typecheck: install
	$(BIN)/mypy

## The whole suite: lint, types, unit + integration + e2e tests (real services, started here).
test: lint typecheck
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

unit: install
	$(BIN)/python -m pytest -q tests/unit $(PYTEST_ARGS)

bench: install
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
