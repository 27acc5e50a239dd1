"""One Multi-Conv DAPO step with LoRA on the real pretrained model (SmolLM2-135M-Instruct): finite loss, only
the adapter weights move, the adapters saved, `memagent merge-lora`, and the merged model's greedy answer equal
to the adapters' own."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from real_model import essay_document

pytestmark = pytest.mark.slow
pytest.importorskip("peft")


def _samples(n=2):
    return [{"id": str(i), "question": f"What is the code of door {i}?",
             "document": essay_document(36, needle=f"The code of door {i} is {417 + i}.", depth=0.5),
             "answers": [str(417 + i)]} for i in range(n)]


def _alternating():
    """A reward of 0, 1, 0, 1, ... in call order, so the group's advantages are not all 0 (this 135M model writes
    no \\boxed{}, so every extracted answer is None): the test checks the machinery on real weights, not learning."""
    calls = []

    def reward(prediction, golds):
        calls.append(prediction)
        return float(len(calls) % 2)

    return reward


def test_one_lora_dapo_step_then_merge(real_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memagent.rl.config import load_config
    from memagent.rl.trainer import train

    tok = AutoTokenizer.from_pretrained(real_model_dir)
    model = AutoModelForCausalLM.from_pretrained(real_model_dir, dtype=torch.float32)
    base = {n: p for n, p in model.named_parameters()}  # peft keeps these tensors as base_layer
    before = {n: p.detach().clone() for n, p in base.items()}
    cfg = load_config(None, [
        f"out_dir={tmp_path / 'run'}", f"model={real_model_dir}", "total_steps=1", "save_every=1", "progress=false",
        "rollout.batch_size=1", "rollout.group_size=4", "update.mini_batch_size=1", "update.micro_batch_size=8",
        "agent.chunk_tokens=64", "agent.memory_tokens=16", "agent.answer_tokens=8", "agent.query_tokens=32",
        "lora.r=4", "lora.alpha=8", "optim.lr=1e-3", "optim.warmup_steps=0"])
    res = train(cfg, _samples(), _alternating(), model=model, tokenizer=tok)
    step = res.metrics[0]
    assert math.isfinite(step["loss"]), step
    assert all(torch.equal(p.detach(), before[n]) for n, p in base.items())  # every base weight bit-identical
    lora = {n: p for n, p in res.model.named_parameters() if p.requires_grad}
    assert lora and all("lora_" in n for n in lora)
    assert any(p.abs().max() > 0 for n, p in lora.items() if "lora_B" in n)  # B started at 0: the step moved it
    saved = sorted(p.name for p in (res.checkpoint / "model").iterdir())
    assert "adapter_model.safetensors" in saved and "model.safetensors" not in saved

    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "memagent.cli", "merge-lora", res.checkpoint, tmp_path / "merged"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        assert (merged(ids).logits - res.model(ids).logits).abs().max() < 1e-3
        want = res.model.generate(ids, max_new_tokens=12, do_sample=False)
        got = merged.generate(ids, max_new_tokens=12, do_sample=False)
    assert got.tolist() == want.tolist()
