# distbench: `make reports` regenerates every report; `make test` runs the suite;
# `make reports-ci` regenerates the CI profile's reports into $(CI_REPORTS) (what
# .github/workflows/ci.yml uploads). All create .venv on first use and install the project
# with torch pinned (constraints.txt).
PYTHON ?= python3
CI_REPORTS ?= reports-ci
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv test reports reports-ci bench lint format clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

test: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -q

reports: venv
	$(PY) -m bench.make_reports

# An absolute --out: the experiments run as subprocesses from the repository root.
reports-ci: venv
	$(PY) -m bench.make_reports --profile ci --out $(abspath $(CI_REPORTS))

bench: venv
	$(PY) -m pytest benchmarks -q --benchmark-only

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: venv
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

clean:
	rm -rf $(VENV) outputs multirun wandb reports-ci .pytest_cache .benchmarks
