# `make run` trains the bundled default job; `make test` runs the test suite.
# Both create the virtual environment first when it is missing or out of date.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/trainflow run $(CONFIG) $(foreach s,$(SET),--set $(s))

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py --rounds $(or $(ROUNDS),3)

lint: $(STAMP)
	$(BIN)/ruff check trainflow tests

clean:
	rm -rf .trainflow .pytest_cache
