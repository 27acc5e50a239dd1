"""`memagent eval` with the real pretrained model on real-haystack RULER samples (Paul Graham's essays, lengths
by the model's own tokenizer): memagent, lookup, skim, full-context and rag-bm25 rows, every sample finished."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def _cli(*args, timeout=1200):
    run = subprocess.run([sys.executable, "-m", "memagent.cli", *map(str, args)], capture_output=True, text=True,
                         timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def test_eval_five_methods_on_real_haystack_niah(real_model_dir, tmp_path):
    data = tmp_path / "niah.jsonl"
    _cli("data", "ruler", "--task", "niah_single_2", "--haystack", "essays", "--tokens", 512, "--samples", 2,
         "--tokenizer", real_model_dir, "--out", data)
    samples = [json.loads(line) for line in data.read_text().splitlines()]
    assert all(abs(s["num_tokens"] - 512) <= 16 and "special magic numbers" in s["context"] for s in samples)
    assert "What hard liquor" in samples[0]["context"]  # the essays' first sentence: the real haystack
    methods = ["memagent", "lookup", "skim", "full-context", "rag-bm25"]
    _cli("eval", "--model", real_model_dir, "--data", data, "--methods", ",".join(methods), "--chunk-tokens", 256,
         "--memory-tokens", 16, "--answer-tokens", 8, "--query-tokens", 96, "--device", "cpu", "--dtype",
         "float32", "--no-progress", "--out", tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["records"]["planned"] == summary["records"]["finished"] == 10
    assert summary["records"]["failed"] == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert sorted({r["method"] for r in records}) == sorted(methods)
    for r in records:
        assert r["status"] == "ok" and 0.0 <= r["score"] <= 1.0
    tokens = {s["id"]: s["num_tokens"] for s in samples}
    for r in records:
        if r["method"] in ("full-context", "rag-bm25"):
            assert r["tokens"]["calls"] == 1
        if r["method"] == "memagent":  # one call a chunk of 256 tokens, then the answer
            assert r["tokens"]["calls"] == -(-tokens[r["sample_id"]] // 256) + 1
    table = (tmp_path / "run" / "table.md").read_text()
    assert all(m in table for m in methods)
