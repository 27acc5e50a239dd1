"""The real-model recipe end to end on the tiny model (docs/real_model.md): `memagent data warmup` -> `memagent
warmup` (2 sft steps, LoRA) -> `memagent train` with `lora.init` (1 Multi-Conv DAPO step) -> `memagent merge-lora`;
RL starts from the warm-up's adapter, not from B = 0; a warm-up resumes; bad adapters are one error line."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("peft")
ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    """The tiny model, two RULER documents with evidence, and their demonstrations."""
    from memagent.backends.tiny import build_tiny_model

    work = tmp_path_factory.mktemp("recipe")
    model = build_tiny_model(work / "base", seed=0)
    return work, model


def _warmup_args(work, model, out, *extra):
    return ("warmup", ROOT / "configs/rl/smollm2-warmup.yaml", f"model={model}", f"data={work / 'demos.jsonl'}",
            f"out_dir={out}", "batch_size=2", "save_every=1", "lora.r=4", "lora.alpha=8", "progress=false", *extra)


def test_the_recipe_runs_its_three_stages(stage, run_cli):
    work, model = stage
    data, demos = work / "train.jsonl", work / "demos.jsonl"
    assert run_cli("data", "ruler", "--task", "niah_single_1", "--tokens", "300", "--samples", "4", "--tokenizer",
                   "tiny", "--out", data)[0] == 0
    code, _, err = run_cli("data", "warmup", "--data", data, "--tokenizer", model, "--chunk-tokens", "128",
                           "--memory-tokens", "80", "--out", demos)
    assert code == 0, err
    rows = [json.loads(line) for line in demos.read_text().splitlines()]
    finals = sum(r["kind"] == "final" for r in rows)  # a sample whose needle a chunk boundary cuts is left out
    assert finals >= 2 and f"from {finals} samples" in err and len(rows) <= 4 * finals
    # stage 1: 2 warm-up steps of 2 rows (epochs such that exactly 2 steps run)
    code, out, err = run_cli(*_warmup_args(work, model, work / "warmup", f"epochs={4 / len(rows)}"))
    assert code == 0, err
    assert "in 2 step(s)" in out
    metrics = [json.loads(line) for line in (work / "warmup" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and all(m["loss"] > 0 for m in metrics)
    warm = work / "warmup" / "checkpoints" / "step_000002"
    warm_b = {k: v for k, v in load_file(warm / "model" / "adapter_model.safetensors").items() if "lora_B" in k}
    assert any(v.abs().max() > 0 for v in warm_b.values())  # the warm-up moved the adapters off B = 0
    # stage 2: one Multi-Conv DAPO step continuing the warm-up's adapter
    code, out, err = run_cli("train", ROOT / "configs/rl/smollm2-rl.yaml", f"model={model}", f"data={data}",
                             f"out_dir={work / 'rl'}", f"lora.init={warm}", "lora.r=4", "lora.alpha=8", "total_steps=1",
                             "rollout.group_size=2", "rollout.dynamic_sampling=false", "agent.chunk_tokens=128",
                             "agent.memory_tokens=80", "agent.answer_tokens=8", "agent.query_tokens=128",
                             "progress=false", "optim.lr=1e-12")
    assert code == 0, err
    rl = work / "rl" / "checkpoints" / "step_000001" / "model" / "adapter_model.safetensors"
    rl_b = {k: v for k, v in load_file(rl).items() if "lora_B" in k}
    assert rl_b.keys() == warm_b.keys()
    # lr 1e-12: RL's adapters are the warm-up's (within AdamW's first step), so RL started from them, not from 0
    assert all((rl_b[k] - warm_b[k]).abs().max() < 1e-6 for k in warm_b)
    # stage 3: merged into a plain model folder
    code, _, err = run_cli("merge-lora", work / "rl" / "checkpoints" / "step_000001", work / "merged", "--base", model)
    assert code == 0, err
    assert (work / "merged" / "model.safetensors").is_file()


def test_a_warmup_resumes_and_a_wrong_adapter_is_one_line(stage, run_cli, tmp_path):
    from memagent.backends.tiny import build_tiny_model

    work, model = stage
    if not (work / "demos.jsonl").is_file():
        pytest.skip("needs test_the_recipe_runs_its_three_stages first")
    out = tmp_path / "w"
    rows = len((work / "demos.jsonl").read_text().splitlines())
    args = _warmup_args(work, model, out, f"epochs={4 / rows}")  # 2 steps
    assert run_cli(*args)[0] == 0
    first = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(out / "checkpoints" / "step_000002")  # as if killed after step 1's checkpoint
    code, stdout, err = run_cli(*args, "--resume")
    assert code == 0, err
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and metrics[0] == first[0]  # step 1 not done again
    assert metrics[1]["loss"] == pytest.approx(first[1]["loss"], rel=1e-5)  # step 2 as the first run did it
    # without --resume the finished run is not overwritten
    code, _, err = run_cli(*_warmup_args(work, model, out))
    assert code == 2 and err.startswith("error: ") and "resume" in err and len(err.strip().splitlines()) == 1
    adapter = out / "checkpoints" / "step_000002"
    # an adapter of another r
    code, _, err = run_cli(*_warmup_args(work, model, tmp_path / "w2", f"lora.init={adapter}", "lora.r=8"))
    assert code == 2 and "lora.init" in err and "r=4" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "w2" / "checkpoints").exists()
    # an adapter of another base (other shapes): refused by lora.init and by merge-lora, nothing written
    other = build_tiny_model(tmp_path / "other", seed=0, hidden_size=32, intermediate_size=64)
    code, _, err = run_cli(*_warmup_args(work, other, tmp_path / "w3", f"lora.init={adapter}"))
    assert code == 2 and "another base model" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli("merge-lora", adapter, tmp_path / "m", "--base", other)
    assert code == 2 and "another base model" in err and not (tmp_path / "m").exists()
    # a truncated adapter file
    cut = tmp_path / "cut"
    (cut / "model").mkdir(parents=True)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (cut / "model" / name).write_bytes((adapter / "model" / name).read_bytes())
    weights = cut / "model" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    code, _, err = run_cli("merge-lora", cut, tmp_path / "m2", "--base", model)
    assert code == 2 and err.startswith("error: ") and not (tmp_path / "m2").exists()
    code, _, err = run_cli(*_warmup_args(work, model, tmp_path / "w4", f"lora.init={cut}"))
    assert code == 2 and err.startswith("error: ") and not (tmp_path / "w4" / "checkpoints").exists()
    # a missing adapter file
    weights.unlink()
    code, _, err = run_cli("merge-lora", cut, tmp_path / "m3", "--base", model)
    assert code == 2 and err.startswith("error: ") and not (tmp_path / "m3").exists()


def test_a_warmup_stopped_at_a_step_is_the_longer_runs_checkpoint(stage, run_cli, tmp_path):
    """stop_at=2 of a 3-step run: the schedule stays the 3-step run's, so its step-2 adapter is the one the run to
    the end wrote at step 2 (how the recipe rebuilds round 2, stopped at step 30 of 49); resuming it trains nothing."""
    work, model = stage
    if not (work / "demos.jsonl").is_file():
        pytest.skip("needs test_the_recipe_runs_its_three_stages first")
    rows = len((work / "demos.jsonl").read_text().splitlines())
    whole = _warmup_args(work, model, tmp_path / "whole", f"epochs={6 / rows}", "optim.schedule=cosine",
                          "optim.warmup_steps=0")  # 3 steps
    code, out, err = run_cli(*whole)
    assert code == 0 and "in 3 step(s)" in out, err
    stopped = _warmup_args(work, model, tmp_path / "stopped", f"epochs={6 / rows}", "optim.schedule=cosine",
                           "optim.warmup_steps=0", "stop_at=2")
    code, out, err = run_cli(*stopped)
    assert code == 0 and "in 2 step(s)" in out, err
    assert [p.name for p in sorted((tmp_path / "stopped" / "checkpoints").iterdir())] == ["step_000001", "step_000002"]
    got, want = (load_file(tmp_path / run / "checkpoints" / "step_000002" / "model" / "adapter_model.safetensors")
                 for run in ("stopped", "whole"))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    # the stopped run's learning rates are the long run's first two; a 2-step cosine would end at its floor (0.1 x)
    lrs = {run: [json.loads(line)["lr"] for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
           for run in ("stopped", "whole")}
    assert lrs["stopped"] == lrs["whole"][:2] and lrs["whole"][1] > lrs["whole"][2] > lrs["whole"][0] * 0.1
    code, out, err = run_cli(*stopped, "--resume")
    assert code == 0 and "already stopped at step_000002" in out, err
    assert len((tmp_path / "stopped" / "metrics.jsonl").read_text().splitlines()) == 2
