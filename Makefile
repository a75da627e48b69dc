# Two entry points: `make demo` (runs the example Kafka->Kafka asset on embedded defaults)
# and `make test` (the test suite). Both create .venv on first use and run scripts/setup-test-env,
# the machine set-up CI uses too (Java; for the tests also JDBC drivers, PostgreSQL, MariaDB).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test dagster reliability lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	scripts/setup-test-env demo
	$(BIN)/python -m dpone_dagster.demo

test: $(STAMP)
	scripts/setup-test-env test
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The fault suite (tests marked `faults`), rewriting docs/reliability.md from what it measured.
reliability: $(STAMP)
	scripts/setup-test-env test
	$(BIN)/python scripts/reliability_report.py

# Webserver + daemon on the local PostgreSQL with the repository's dagster.yaml (scripts/dagster-local).
dagster: $(STAMP)
	scripts/dagster-local

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .dpone .dagster_home .pytest_cache
