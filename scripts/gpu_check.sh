#!/usr/bin/env bash
# The GPU paths of training on the tiny model, at most 10 minutes on one GPU: vLLM weight push,
# vLLM sleep/wake, flash-attention varlen (packing), NCCL weight broadcast (needs 2 GPUs).
# Prints PASS / FAIL / SKIP per path; exit 1 when a path fails, 2 without a GPU.
# Usage: scripts/gpu_check.sh   (from the repository root, with memagent and vllm installed)
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "FAIL gpu: no NVIDIA GPU here (nvidia-smi finds none); run this script on a machine with a CUDA GPU"
    exit 2
fi
nvidia-smi -L
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false
timeout --signal=INT --kill-after=20 600 "$PY" scripts/gpu_check.py
rc=$?
if [ "$rc" -eq 124 ] || [ "$rc" -eq 130 ]; then
    echo "FAIL timeout: the checks ran past 10 minutes"
    exit 1
fi
exit "$rc"
