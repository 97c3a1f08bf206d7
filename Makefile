# distbench: `make reports` regenerates every report; `make test` runs the suite.
# Both create .venv on first use and install the project with torch pinned (constraints.txt).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv test reports bench lint format clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

test: venv
	$(PY) -m ruff check .
	$(PY) -m pytest -q

reports: venv
	$(PY) -m bench.make_reports

bench: venv
	$(PY) -m pytest benchmarks -q --benchmark-only

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: venv
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

clean:
	rm -rf $(VENV) outputs multirun wandb .pytest_cache .benchmarks
