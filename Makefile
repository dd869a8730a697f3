# Two entry points: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

# Known-good CPU pins (fbgemm-gpu-cpu 1.9.0 does not load with torch 2.13). torchrec
# requires the CUDA build of fbgemm-gpu, so it is installed with --no-deps next to
# fbgemm-gpu-cpu.
CPU_PINS := torch==2.13.0 fbgemm-gpu-cpu==1.8.0
TORCHREC_PIN := torchrec==1.8.0

.PHONY: venv demo lint test clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(CPU_PINS)
	$(PIP) install -q --no-deps $(TORCHREC_PIN)
	$(PIP) install -q -e '.[test]' $(CPU_PINS)
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# ruff (lint and format) and mypy, configured in pyproject.toml; `make test` runs it first.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) build *.egg-info
