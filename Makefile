# The two commands: `make demo` (or `make demo-quick`) and `make test`. All work from a fresh
# clone. `make docs` builds the documentation site into site/ (`make test` builds it too).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU build of torch, installed before anything else so that no dependency pulls a
# multi-GB CUDA build. Elsewhere, e.g.: make TORCH="torch --index-url https://download.pytorch.org/whl/cpu"
TORCH  ?= torch==2.13.0
HOST   ?= 127.0.0.1
PORT   ?= 8050
DOCS_PORT ?= 8000
PYTEST_ARGS ?=
# MkDocs' own banner about its next major version is not about this site
export NO_MKDOCS_2_WARNING := 1

.PHONY: setup fetch demo demo-quick dashboard test unit notebooks tutorials lint docs docs-serve fuzz bench clean

$(BIN)/workbench: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e ".[dev,ray,docs,notebooks]"
	touch $@

setup: $(BIN)/workbench

fetch: setup
	$(BIN)/workbench fetch

# The dashboard starts first, in the background, and its pages fill as the runs complete;
# the demo prints its plan, then each step as it starts. When the demo is done the dashboard
# goes on serving; Ctrl-C stops both (a failed demo stops the dashboard too).
define serve_and_demo
	@$(BIN)/workbench dashboard --host $(HOST) --port $(PORT) & dash=$$!; \
	trap 'kill $$dash 2>/dev/null; exit 130' INT TERM; \
	$(BIN)/workbench demo $(1) || { status=$$?; kill $$dash 2>/dev/null; exit $$status; }; \
	echo "the demo is done; the dashboard goes on at http://$(HOST):$(PORT)/ (Ctrl-C stops it)"; \
	wait $$dash
endef

demo: fetch
	$(call serve_and_demo,)

# The demo on the encoder minilm alone: its recording, experiments and claims (32 s on 2 idle
# cores into an empty run store).
demo-quick: setup
	$(BIN)/workbench fetch minilm
	$(call serve_and_demo,--models minilm)

dashboard: setup
	$(BIN)/workbench dashboard --host $(HOST) --port $(PORT)

test: fetch
	$(BIN)/lint-imports
	$(BIN)/pyright --pythonpath $(BIN)/python
	$(BIN)/mkdocs build --strict
	$(BIN)/python -m pytest $(PYTEST_ARGS)

unit: setup
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

# The tutorial notebooks in notebooks/, each run top to bottom in a Jupyter kernel of this
# environment at the test's sizes, with its runs in a temporary folder (as `make test` does).
notebooks: fetch
	$(BIN)/python -m pytest tests/notebooks $(PYTEST_ARGS)

# The executed copies of the notebooks that the documentation site shows, at the notebooks'
# own sizes (about 25 minutes on 2 cores); tests/notebooks checks that they are current.
tutorials: fetch
	$(BIN)/python notebooks/execute.py $(NOTEBOOKS)

# A longer fuzzing run for before a release: many more examples than `make test` tries.
fuzz: fetch
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest tests/fuzz --hypothesis-show-statistics $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check workbench experiments dashboards tests benchmarks notebooks docs/hooks.py
	$(BIN)/lint-imports
	$(BIN)/pyright --pythonpath $(BIN)/python

# The documentation site from docs/ into site/ (git-ignored); a broken link, a missing
# anchor or a reference that does not resolve fails it. The CLI reference, each
# experiment's fields and tables, the claims and the schemas are generated as it builds.
docs: setup
	$(BIN)/mkdocs build --strict

# The site at http://$(HOST):$(DOCS_PORT)/, rebuilt as docs/, notebooks/ or the code change.
docs-serve: setup
	$(BIN)/mkdocs serve --dev-addr $(HOST):$(DOCS_PORT)

bench: fetch
	$(BIN)/python benchmarks/recording.py
	nice -n 10 $(BIN)/python benchmarks/long_context.py
	nice -n 10 $(BIN)/python benchmarks/sweep.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache site
