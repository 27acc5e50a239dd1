"""The shipped adapter (models/smollm2-memagent: SmolLM2-135M-Instruct taught the memory policy by the recipe of
docs/real_model.md) on held-out needle documents, greedy, under the paper's protocol: `memagent merge-lora` onto the
packaged model, then `memagent ask --input` over RULER niah_single_2 samples built from essays the training never
used (seed 2, `--essays heldout`) at two lengths. What it must show: boxed answers that are the needles' numbers.
The recipe's record (memagent-recipe.json) names the base model's GGUF by its sha256: the test checks it is the
packaged file's."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from real_model import require_real_gguf

pytestmark = pytest.mark.slow
pytest.importorskip("peft")
ADAPTER = Path(__file__).parents[2] / "models" / "smollm2-memagent"
FLAGS = ["--chunk-tokens", "512", "--memory-tokens", "128", "--answer-tokens", "48", "--query-tokens", "128"]
CASES = [(2048, 4), (8192, 2)]  # (document tokens, samples): 1x and 4x the training length
AT_LEAST = 3  # of the 6 documents answered exactly (the packaged model: 0; the measured accuracy: docs/real_model.md)


def test_the_shipped_adapter_records_its_base_and_fits_the_size_limit():
    from memagent.tasks.base import file_sha256

    recipe = json.loads((ADAPTER / "memagent-recipe.json").read_text())
    assert recipe["base"]["sha256"] == file_sha256(require_real_gguf())
    assert recipe["adapter_sha256"] == file_sha256(ADAPTER / "adapter_model.safetensors")
    assert (ADAPTER / "adapter_model.safetensors").stat().st_size < 25 * 2**20
    assert "rebuild" in recipe and recipe["data"]["essays"] == "train"


def test_the_shipped_adapter_answers_held_out_needles(real_model_dir, tmp_path):
    from memagent.backends.tokenizer import load_tokenizer
    from memagent.tasks.base import write_samples
    from memagent.tasks.ruler import synthesize_ruler

    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    merged = tmp_path / "merged"
    run = subprocess.run([sys.executable, "-m", "memagent.cli", "merge-lora", str(ADAPTER), str(merged), "--base",
                          str(real_model_dir)], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    tok = load_tokenizer(str(real_model_dir))
    samples = [s for tokens, n in CASES for s in synthesize_ruler(
        "niah_single_2", tokens=[tokens], samples=n, seed=2, tokenizer=tok, tokenizer_name="smollm2",
        haystack="essays", essays="heldout")]
    data, out = tmp_path / "needles.jsonl", tmp_path / "answers.jsonl"
    write_samples(samples, data)
    run = subprocess.run([sys.executable, "-m", "memagent.cli", "ask", "--model", str(merged), "--input", str(data),
                          "--output", str(out), "--batch-docs", "6", "--no-progress", *FLAGS],
                         capture_output=True, text=True, env=env, timeout=1800)
    assert run.returncode == 0, run.stderr[-2000:]
    answers = {a["id"]: a for a in map(json.loads, out.read_text().splitlines())}
    right = [s["id"] for s in samples if answers[s["id"]]["answer"] == s["answers"][0]]
    assert len(answers) == len(samples) and len(right) >= AT_LEAST, (right, [answers[s["id"]]["answer"] for s in samples])
