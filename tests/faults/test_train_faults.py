"""Training faults: a torn metrics line, damaged checkpoints, a second run on one out_dir (Python API);
kill -9 mid-run, a full disk and a read-only out_dir (the CLI in a subprocess).

Every resumed run must equal the uninterrupted one: the same metrics (timings aside) and weights.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from memagent.config import ConfigError
from memagent.rl.config import load_config
from memagent.rl.trainer import train

from faults_helpers import SRC, limited, read_only_runner, strip_timing

STEPS = 4


@pytest.fixture(scope="module")
def tok():
    from memagent.backends.tiny import build_tokenizer

    return build_tokenizer(vocab_size=1024)


def fresh_model(tok):
    from transformers import AutoModelForCausalLM

    from memagent.backends.tiny import tiny_config

    cfg = tiny_config(len(tok), hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1)
    cfg.eos_token_id, cfg.pad_token_id = tok.eos_token_id, tok.pad_token_id
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    model.generation_config.eos_token_id = [tok.eos_token_id, tok.pad_token_id]
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


def samples(n=12):
    return [{"id": str(i), "question": f"what is the value of key {i}?",
             "document": f"the key {i} has the value {i * 7}. the river is blue.", "answers": [str(i * 7)]}
            for i in range(n)]


def reward(prediction, golds):
    return 0.0 if (prediction or "").strip()[:1].isalpha() else 1.0


def config(out, *extra):
    return load_config(None, [
        f"out_dir={out}", f"total_steps={STEPS}", "save_every=1", "rollout.batch_size=2", "rollout.group_size=2",
        "update.mini_batch_size=1", "update.micro_batch_size=32", "agent.chunk_tokens=12", "agent.memory_tokens=1",
        "agent.answer_tokens=1", "optim.lr=3e-2", "optim.warmup_steps=0", "loss.kl_coef=0", "progress=false", *extra])


def run(tok, out, **kw):
    return train(config(out, *kw.pop("extra", ())), samples(), reward, model=fresh_model(tok), tokenizer=tok, **kw)


@pytest.fixture(scope="module")
def full(tok, tmp_path_factory):
    """The uninterrupted run: (metrics without timings, final weights)."""
    res = run(tok, tmp_path_factory.mktemp("full") / "run")
    return strip_timing(res.metrics), {k: v.detach().clone() for k, v in res.model.state_dict().items()}


@pytest.fixture(scope="module")
def stopped(tok, tmp_path_factory):
    """A run stopped after step 3 (checkpoints 1, 2, 3), copied by each test before it is damaged."""
    out = tmp_path_factory.mktemp("stopped") / "run"
    res = run(tok, out, callback=lambda step, m: step < STEPS - 1)
    assert [r["step"] for r in res.metrics] == [1, 2, 3]
    return out


def resume_and_compare(tok, out, full):
    res = run(tok, out, extra=["resume=true"])
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert strip_timing(lines) == full[0]  # the whole file reads as the uninterrupted run
    for name, value in res.model.state_dict().items():
        assert torch.equal(value, full[1][name]), name
    return res


def test_torn_metrics_line_is_trimmed_on_resume(tok, stopped, full, tmp_path, caplog):
    out = tmp_path / "run"
    shutil.copytree(stopped, out)
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "reward": 0.5, "lo')  # killed while writing step 4's line
    with caplog.at_level(logging.WARNING):
        res = resume_and_compare(tok, out, full)
    assert [r["step"] for r in res.metrics] == [4]
    assert "cut short" in caplog.text


DAMAGE = {  # name: (file, how it is spoilt, what the warning says)
    "truncated weights": ("model/model.safetensors", lambda p: p.write_bytes(p.read_bytes()[:1000]),
                          "model/model.safetensors is"),
    "truncated optimizer": ("optimizer.safetensors", lambda p: p.write_bytes(p.read_bytes()[:-7]),
                            "optimizer.safetensors is"),
    "trainer state not JSON": ("trainer_state.json", lambda p: p.write_text('{"step": 3, "data_pos'),
                               "trainer_state.json is not valid JSON"),
    "rng state not JSON": ("rng_rank0.json", lambda p: p.write_text("[1, 2"), "rng_rank0.json is not valid JSON"),
    "weights missing": ("model/model.safetensors", lambda p: p.unlink(), "model/ holds no *.safetensors"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_latest_checkpoint_falls_back_to_the_previous_one(tok, stopped, full, tmp_path, caplog, damage):
    out = tmp_path / "run"
    shutil.copytree(stopped, out)
    name, spoil, said = DAMAGE[damage]
    spoil(out / "checkpoints" / "step_000003" / name)
    metrics = out / "metrics.jsonl"
    before = metrics.read_bytes()
    os.link(metrics, tmp_path / "old_metrics")  # the same inode: it shows any in-place rewrite
    with caplog.at_level(logging.WARNING):
        res = resume_and_compare(tok, out, full)
    assert [r["step"] for r in res.metrics] == [3, 4]  # resumed from step 2
    assert "step_000003 is damaged" in caplog.text and said in caplog.text, caplog.text
    assert (tmp_path / "old_metrics").read_bytes() == before  # replaced by rename, never rewritten in place


def test_ctrl_c_after_a_step_before_its_checkpoint(tok, full, tmp_path):
    """Interrupted after step 3's metrics line, before its checkpoint: the resume drops that line by rename."""
    out = tmp_path / "run"

    def interrupt(step, metrics):
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(tok, out, extra=["save_every=2"], callback=interrupt)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3]
    os.link(out / "metrics.jsonl", tmp_path / "old_metrics")
    res = resume_and_compare(tok, out, full)
    assert [r["step"] for r in res.metrics] == [3, 4]
    assert (tmp_path / "old_metrics").read_text().splitlines() == lines  # the old file was not truncated


def test_every_checkpoint_damaged_is_a_clear_error(tok, stopped, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(stopped, out)
    for ckpt in (out / "checkpoints").iterdir():
        (ckpt / "trainer_state.json").write_text("{")
    with pytest.raises(ConfigError, match="every checkpoint under .* is damaged"):
        run(tok, out, extra=["resume=true"])


def test_second_run_on_one_out_dir_refuses(tok, tmp_path):
    from memagent.lock import RunLockedError, run_lock

    out = tmp_path / "run"
    with run_lock(out, "training run"):  # another run holds the folder
        with pytest.raises(RunLockedError, match=r"another training run is writing to .*run"):
            run(tok, out, extra=["total_steps=1"])
    assert not (out / "checkpoints").exists() and not (out / "metrics.jsonl").exists()


# -- the CLI in a subprocess: kill -9, a full disk, a read-only out_dir ------------------------------


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory):
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
                   "  answer_tokens: 2\nrollout:\n  batch_size: 2\n  group_size: 2\nupdate:\n  mini_batch_size: 2\n"
                   "optim:\n  lr: 1.0e-3\n  warmup_steps: 1\n")
    return root, model, cfg


def train_cmd(cli_files, out, *extra):
    root, model, cfg = cli_files
    return [sys.executable, "-m", "memagent.cli", "train", str(cfg), f"model={model}", f"data={root / 'train.jsonl'}",
            f"out_dir={out}", *extra]


def env():
    return dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(ckpt / "model" / "model.safetensors")


@pytest.mark.slow
def test_kill_9_mid_train_then_resume_equals_an_uninterrupted_run(cli_files, tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    p = subprocess.run(train_cmd(cli_files, whole), env=env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    proc = subprocess.Popen(train_cmd(cli_files, killed), env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not (killed / "checkpoints" / "step_000001").is_dir() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL  # it was still running
    assert not (killed / "checkpoints" / "step_000002").exists()
    p = subprocess.run(train_cmd(cli_files, killed, "--resume"), env=env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    read = lambda out: strip_timing([json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()])  # noqa: E731
    assert read(killed) == read(whole) and [r["step"] for r in read(whole)] == [1, 2]
    a, b = weights(whole / "checkpoints" / "step_000002"), weights(killed / "checkpoints" / "step_000002")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_full_disk_during_train_is_one_error_line(cli_files, tmp_path):
    """A 64 KB file-size limit: the run's small files fit, the first checkpoint's weights do not."""
    out = tmp_path / "run"
    p = subprocess.run(train_cmd(cli_files, out), env=env(), capture_output=True, text=True, timeout=300,
                       preexec_fn=limited(64_000))
    assert p.returncode == 2, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: cannot write checkpoint step_000001") and "File too large" in last, last
    assert not list((out / "checkpoints").glob("step_*")), "a partial checkpoint was left behind"


@pytest.mark.slow
def test_read_only_out_dir_is_one_error_line(cli_files, tmp_path):
    parent = tmp_path / "locked"
    parent.mkdir()
    parent.chmod(0o555)
    p = subprocess.run(train_cmd(cli_files, parent / "run"), env=env(), capture_output=True, text=True,
                       timeout=300, preexec_fn=read_only_runner())
    assert p.returncode == 2, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "permission denied" in last.lower() and str(parent) in last, last
