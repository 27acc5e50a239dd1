"""`memagent train` from the command line: one process, and 2 processes under torchrun (gloo)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl_helpers import torchrun

SRC = Path(__file__).parents[2] / "src"


@pytest.fixture(scope="module")
def run_files(tmp_path_factory):
    from memagent.backends.tiny import build_tiny_model, build_tokenizer

    root = tmp_path_factory.mktemp("cli")
    model = build_tiny_model(root / "tiny", tokenizer=build_tokenizer(vocab_size=1024), hidden_size=32,
                             intermediate_size=64)
    with open(root / "train.jsonl", "w") as f:
        for i in range(8):
            f.write(json.dumps({"id": f"q{i}", "task": "keys", "question": f"what is key {i}?",
                                "context": f"the key {i} is {i * 3}. the sky is blue.", "answers": [str(i * 3)]}) + "\n")
    cfg = root / "cfg.yaml"
    cfg.write_text("total_steps: 2\nsave_every: 1\nprogress: false\nagent:\n  chunk_tokens: 8\n  memory_tokens: 2\n"
                   "  answer_tokens: 2\nrollout:\n  batch_size: 4\n  group_size: 2\nupdate:\n  mini_batch_size: 2\n"
                   "optim:\n  lr: 1.0e-3\n  warmup_steps: 1\n")
    return root, model, cfg


def cli(*args):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(SRC))
    return subprocess.run([sys.executable, "-m", "memagent.cli", *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=300)


def check_run(out: Path, steps: int):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    ckpt = out / "checkpoints" / f"step_{steps:06d}"
    model = AutoModelForCausalLM.from_pretrained(ckpt / "model")
    AutoTokenizer.from_pretrained(ckpt / "model")
    assert not list((out / "checkpoints").glob("*.tmp"))
    return records, model


@pytest.mark.slow
def test_cli_train_and_resume(run_files, tmp_path):
    root, model, cfg = run_files
    out = tmp_path / "one"
    p = cli("train", cfg, f"model={model}", f"data={root / 'train.jsonl'}", f"out_dir={out}", "total_steps=1")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "checkpoint:" in p.stdout
    p = cli("train", cfg, f"model={model}", f"data={root / 'train.jsonl'}", f"out_dir={out}", "--resume")
    assert p.returncode == 0, p.stderr[-3000:]
    records, _ = check_run(out, 2)
    assert records[1]["kept_groups"] == 4 and records[1]["conversations_per_sample"] >= 2
    bad = cli("train", cfg, "loss.clip_high=0.1", f"model={model}")
    assert bad.returncode == 2 and "clip_high" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_process_training_run(run_files, tmp_path, strategy):
    root, model, cfg = run_files
    out = tmp_path / strategy
    args = ["-m memagent.cli", "train", cfg, f"model={model}", f"data={root / 'train.jsonl'}", f"out_dir={out}",
            f"strategy={strategy}"]
    if strategy == "fsdp":  # also resume a sharded run: optimiser state re-sharded from the full copy
        torchrun(*args, "total_steps=1", timeout=400)
        torchrun(*args, "--resume", timeout=400)
    else:
        torchrun(*args, timeout=400)
    records, loaded = check_run(out, 2)
    assert records[-1]["kept_groups"] == 4 and records[-1]["optimizer_steps"] == 2
    assert sum(p.numel() for p in loaded.parameters()) > 0
    # every rank wrote its own generator states; rank 0 the weights and optimiser
    ckpt = out / "checkpoints" / "step_000002"
    assert (ckpt / "rng_rank0.safetensors").is_file() and (ckpt / "rng_rank1.safetensors").is_file()
    assert json.loads((ckpt / "trainer_state.json").read_text())["world_size"] == 2
