"""Sharded (DCP) checkpoints: each rank writes its shards as safetensors, nothing is pickled, and a run saved by
2 processes resumes under 1 or 2 with the metrics of the uninterrupted run."""
import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from rl_helpers import torchrun
from dcp_script import run


def metrics(out: Path) -> list[dict]:
    drop = {"step_s"}
    return [{k: v for k, v in json.loads(x).items() if k not in drop} for x in (out / "metrics.jsonl").read_text().splitlines()]


def cut_back(src: Path, dst: Path, step: int) -> None:
    """dst: a copy of run src as if it had stopped after checkpoint `step`."""
    shutil.copytree(src, dst)
    for ckpt in (dst / "checkpoints").glob("step_*"):
        if int(ckpt.name.split("_")[1]) > step:
            shutil.rmtree(ckpt)


@pytest.fixture
def no_pickle(monkeypatch):
    """pickle.load / pickle.loads fail for the test's duration (torch.load(weights_only=True) does not use them)."""
    def refuse(*a, **k):
        raise AssertionError("something unpickled")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)


def test_one_process_save_and_resume_equals_the_uninterrupted_run(tmp_path, no_pickle):
    full = run(str(tmp_path / "a"), "ddp", 3, False)
    ckpt = tmp_path / "a" / "checkpoints" / "step_000001"
    assert sorted(p.name for p in (ckpt / "dcp").iterdir()) == ["shard-00001-model-00001-of-00001.safetensors"]
    assert not list(ckpt.rglob(".metadata")) and not (ckpt / "optimizer.safetensors").exists()
    cut_back(tmp_path / "a", tmp_path / "b", 1)
    resumed = run(str(tmp_path / "b"), "ddp", 3, True)
    assert metrics(tmp_path / "b") == metrics(tmp_path / "a")  # exactly, steps 2 and 3 included
    for (name, p), q in zip(full.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), name


def test_a_damaged_shard_makes_resume_use_the_checkpoint_before(tmp_path, caplog):
    from memagent.rl.checkpoint import checkpoint_problem, resume_checkpoint

    run(str(tmp_path / "a"), "ddp", 2, False)
    root = tmp_path / "a" / "checkpoints"
    [shard] = (root / "step_000002" / "dcp").iterdir()
    shard.write_bytes(shard.read_bytes()[:-10])  # cut short, as by a crash or a full disk
    assert "dcp/" in checkpoint_problem(root / "step_000002") and "truncated" in checkpoint_problem(root / "step_000002")
    assert resume_checkpoint(root) == root / "step_000001"
    assert "step_000002 is damaged" in caplog.text


def test_asynchronous_save_gives_the_same_checkpoints(tmp_path):
    """checkpoint.async_save: the shards are staged (copied) then written in the background while training goes
    on; each checkpoint is published at the next save or the run's end, and holds exactly the synchronous one."""
    from safetensors.torch import load_file

    run(str(tmp_path / "sync"), "ddp", 3, False)
    res = run(str(tmp_path / "async"), "ddp", 3, False, 0, True)
    assert res.checkpoint == tmp_path / "async" / "checkpoints" / "step_000003" and res.checkpoint.is_dir()
    assert metrics(tmp_path / "async") == metrics(tmp_path / "sync")
    for step in (1, 2, 3):  # saved at step 1 while steps 2 and 3 changed the weights: still step 1's values
        name = f"step_{step:06d}/dcp/shard-00001-model-00001-of-00001.safetensors"
        a, b = (load_file(tmp_path / run_ / "checkpoints" / name) for run_ in ("sync", "async"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not list((tmp_path / "async" / "checkpoints").glob("*.tmp"))
    cut_back(tmp_path / "async", tmp_path / "b", 1)
    run(str(tmp_path / "b"), "ddp", 3, True, 0, True)
    assert metrics(tmp_path / "b") == metrics(tmp_path / "sync")


def test_lora_run_shards_hold_only_the_adapters(tmp_path):
    run(str(tmp_path / "a"), "ddp", 2, False, 4)
    from safetensors import safe_open

    ckpt = tmp_path / "a" / "checkpoints" / "step_000001"
    [shard] = (ckpt / "dcp").iterdir()
    with safe_open(str(shard), "pt") as f:
        keys = list(f.keys())
    model_keys = [k for k in keys if k.startswith("model/")]
    # 2 layers x (q_proj, v_proj) x (lora_A, lora_B), and AdamW's exp_avg, exp_avg_sq, step for each
    assert len(model_keys) == 8 and all("lora_" in k for k in model_keys), model_keys
    assert len(keys) == 8 * 4
    cut_back(tmp_path / "a", tmp_path / "b", 1)
    run(str(tmp_path / "b"), "ddp", 2, True, 4)
    assert metrics(tmp_path / "b") == metrics(tmp_path / "a")


@pytest.mark.slow
@pytest.mark.parametrize("strategy,async_save", [("fsdp", 1), ("ddp", 0)])
def test_saved_by_two_processes_resumed_by_one_and_by_two(tmp_path, strategy, async_save, monkeypatch):
    script = "dcp_script.py"
    torchrun(script, tmp_path / "a", strategy, 3, 0, 0, async_save, timeout=400)  # uninterrupted, 2 processes
    ckpt = tmp_path / "a" / "checkpoints" / "step_000001"
    shards = sorted(p.name for p in (ckpt / "dcp").iterdir())
    assert shards == ["shard-00001-model-00001-of-00001.safetensors", "shard-00002-model-00001-of-00001.safetensors"]
    assert json.loads((ckpt / "trainer_state.json").read_text())["world_size"] == 2
    full = metrics(tmp_path / "a")
    cut_back(tmp_path / "a", tmp_path / "two", 1)
    torchrun(script, tmp_path / "two", strategy, 3, 1, timeout=400)
    assert metrics(tmp_path / "two") == full  # the same 2 processes: exactly equal
    cut_back(tmp_path / "a", tmp_path / "one", 1)
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    run(str(tmp_path / "one"), strategy, 3, True)  # one process (no torchrun): the pieces of both shard files
    one = metrics(tmp_path / "one")
    assert [r["step"] for r in one] == [1, 2, 3] and one[0] == full[0]
    for a, b in zip(one[1:], full[1:]):  # reductions over 1 rank instead of 2: float64 rounding only
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-9, abs=1e-12), (a["step"], k)


@pytest.mark.slow
def test_cli_fsdp_lora_async_run_resumed_by_one_process_then_merged(tmp_path):
    """The pieces together through the CLI: FSDP2 over 2 processes with LoRA adapters and asynchronous sharded
    checkpoints, resumed by 1 process, the adapters merged into a model that transformers loads."""
    import os
    import subprocess
    import sys

    from transformers import AutoModelForCausalLM

    from memagent.backends.tiny import build_tiny_model, build_tokenizer

    model = build_tiny_model(tmp_path / "tiny", tokenizer=build_tokenizer(vocab_size=1024), hidden_size=32,
                             intermediate_size=64)
    with open(tmp_path / "train.jsonl", "w") as f:
        for i in range(8):
            f.write(json.dumps({"id": f"q{i}", "question": f"what is key {i}?", "answers": [str(i * 3)],
                                "context": f"the key {i} is {i * 3}. the sky is blue."}) + "\n")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("total_steps: 2\nsave_every: 1\nprogress: false\nagent: {chunk_tokens: 8, memory_tokens: 2, "
                   "answer_tokens: 2}\nrollout: {batch_size: 4, group_size: 2}\nupdate: {mini_batch_size: 2}\n"
                   "loss: {kl_coef: 0.01}\nlora: {r: 4}\ncheckpoint: {format: dcp, async_save: true}\n")
    args = ["train", cfg, f"model={model}", f"data={tmp_path / 'train.jsonl'}", f"out_dir={tmp_path / 'out'}"]
    torchrun("-m memagent.cli", *args, "strategy=fsdp", "total_steps=1", timeout=400)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).parents[2] / "src"))
    cli = [sys.executable, "-m", "memagent.cli"]
    p = subprocess.run([*cli, *map(str, args), "--resume"], env=env, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    records = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and records[1]["kl"] >= 0
    ckpt = tmp_path / "out" / "checkpoints" / "step_000001"
    assert len(list((ckpt / "dcp").glob("*.safetensors"))) == 2  # written by 2 processes
    assert (ckpt / "model" / "adapter_model.safetensors").is_file()
    p = subprocess.run([*cli, "merge-lora", tmp_path / "out" / "checkpoints" / "step_000002", tmp_path / "merged"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert sum(x.numel() for x in AutoModelForCausalLM.from_pretrained(tmp_path / "merged").parameters()) > 0
