# Two commands on a fresh machine: `make demo` (the main job on the embedded real scene) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: the CPU build (an open range would pull a multi-GB CUDA build)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,cpu]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/hsgds demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

.PHONY: install demo test
