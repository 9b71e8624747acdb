# Every target sets itself up from nothing: a .venv installed through constraints.txt.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
EXTRAS := dev,tensorplay,cli,demo,hf

.PHONY: setup test lint typecheck unit bench bench-quick bench-calibrated demo clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt src/prunekit/select/_native.c
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[$(EXTRAS)]'
	touch $(STAMP)

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: setup
	$(PY) -m mypy

unit: setup
	$(PY) -m pytest -q -n 2

test: lint typecheck unit

bench: setup
	$(PY) benchmarks/run.py

bench-quick: setup
	$(PY) benchmarks/run.py --quick

bench-calibrated: setup
	$(PY) benchmarks/calibrated.py

demo: setup
	$(VENV)/bin/prunekit demo

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
