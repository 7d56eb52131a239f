# `make run` trains the bundled default job; `make test` runs the test suite; `make bench`
# measures (benchmarks/results.md).
# Each creates the virtual environment first when it is missing or out of date.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test lint bench clean docs docs-serve

setup: $(STAMP)

# PYTHONWARNINGS hides setuptools' notice on every editable install of a package at the
# project's root (a folder named like the package in the working directory would shadow it),
# which a user of `make run` cannot act on.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	PYTHONWARNINGS='ignore:Editable installation' $(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/trainflow run $(CONFIG) $(foreach s,$(SET),--set $(s))

# The suite's test files on parallel pytest-xdist workers, one per core up to 4 (each
# worker starts its own Ray cluster and Prefect test server), the slowest files first
# (tests/conftest.py); WORKERS=0 runs it in one process. benchmarks/suite.py measures the
# same by default.
WORKERS ?= auto

test: $(STAMP)
	$(BIN)/python -m pytest -n $(WORKERS) --maxprocesses=4 --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# Every benchmark section, then benchmarks/results.md; a subset: make bench SECTIONS="ingest training".
# ROUNDS: the overhead section's alternating rounds; overhead also runs its --phases section,
# and scaling its --stream section.
SECTIONS ?= overhead warm_start load cold_under_load ingest training epoch_save resnet scaling large_prepare image_memory batch_predict serve gpu sweep hf_models hf_finetune

bench: $(STAMP)
	@for s in $(SECTIONS); do \
		test -f benchmarks/$$s.py || { echo "no benchmark section $$s (benchmarks/$$s.py)"; exit 1; }; \
		echo "== $$s"; \
		if [ $$s = overhead ]; then \
			$(BIN)/python benchmarks/overhead.py --rounds $(or $(ROUNDS),3) || exit 1; \
			$(BIN)/python benchmarks/overhead.py --phases || exit 1; \
		elif [ $$s = scaling ]; then \
			$(BIN)/python benchmarks/scaling.py || exit 1; \
			$(BIN)/python benchmarks/scaling.py --stream || exit 1; \
		else $(BIN)/python benchmarks/$$s.py || exit 1; fi; \
	done
	$(BIN)/python benchmarks/report.py

# The documentation site, built strictly (a broken link or a missing name fails it) into site/;
# docs-serve serves it on loopback while you edit.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs

docs: $(STAMP)
	$(MKDOCS) build --strict

docs-serve: $(STAMP)
	$(MKDOCS) serve --strict -a 127.0.0.1:8001

lint: $(STAMP)
	$(BIN)/ruff check trainflow tests benchmarks

clean:
	rm -rf .trainflow .pytest_cache site
