# Two commands on a fresh machine: `make demo` (the main job on the embedded real scene) and `make test`.
PYTHON ?= python3
TORCH_INDEX ?=
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: the CPU build (an open range would pull a multi-GB CUDA build). Where the package index
	# serves the CUDA build for this pin (PyPI on Linux), take the CPU one with
	# make TORCH_INDEX=https://download.pytorch.org/whl/cpu
	$(BIN)/pip install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install -q -e '.[test,cpu,dali,lint]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/hsgds demo

# one test process per core, up to 4 (tests/conftest.py): the CPU kernel's compiles and the benchmark smoke
# runs are single-threaded
test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto

# ruff (rules in pyproject.toml) on every Python file of the repository, mypy on the hsgds package
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

.PHONY: install demo test lint
