"""Issue 17's check for RL: a run saved by 2 processes (sharded checkpoints), resumed by 1 and by 2, gives the
later metrics of the uninterrupted run when rollouts are seeded per sample (rollout.seeding: sample)."""
import json
import logging
from pathlib import Path

import pytest

from rl_helpers import torchrun
from rl_seeding_script import run

TIMING = {"rollout_s", "tokens_per_s", "update_s", "step_s"}  # wall-clock: differs between any two runs


def metrics(out: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(x).items() if k not in TIMING}
            for x in (out / "metrics.jsonl").read_text().splitlines()]


def cut_back(src: Path, dst: Path, step: int) -> None:
    """dst: a copy of run src as if it had stopped after checkpoint `step` (its later metrics rows dropped too)."""
    import shutil

    shutil.copytree(src, dst)
    for ckpt in (dst / "checkpoints").glob("step_*"):
        if int(ckpt.name.split("_")[1]) > step:
            shutil.rmtree(ckpt)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_rl_run_saved_by_two_resumed_by_one_and_by_two(tmp_path, monkeypatch, caplog, strategy):
    script = "rl_seeding_script.py"
    torchrun(script, tmp_path / "a", 3, 0, "sample", strategy, timeout=300)  # uninterrupted, 2 processes
    full = metrics(tmp_path / "a")
    assert [r["step"] for r in full] == [1, 2, 3]
    assert all(r["pg_loss"] != 0 and r["optimizer_steps"] == 2 for r in full)  # advantages are not all zero
    assert all("val/sampled_acc" in r and "val/greedy_acc" in r for r in full)  # validation is compared too
    assert json.loads((tmp_path / "a" / "checkpoints" / "step_000001" / "trainer_state.json").read_text())["world_size"] == 2
    cut_back(tmp_path / "a", tmp_path / "two", 1)
    torchrun(script, tmp_path / "two", 3, 1, "sample", strategy, timeout=300)
    assert metrics(tmp_path / "two") == full  # the same 2 processes: exactly equal
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    cut_back(tmp_path / "a", tmp_path / "one", 1)
    with caplog.at_level(logging.WARNING, logger="memagent.rl.rollout"):
        run(str(tmp_path / "one"), 3, True, "sample", strategy)  # one process (no torchrun)
    assert "seeded per rank" not in caplog.text
    one = metrics(tmp_path / "one")
    assert [r["step"] for r in one] == [1, 2, 3] and one[0] == full[0]
    for a, b in zip(one[1:], full[1:]):  # the same rollouts; reductions over 1 rank instead of 2: rounding only
        assert a.keys() == b.keys()
        assert a["generated_tokens"] == b["generated_tokens"] and a["reward"] == b["reward"], a["step"]
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-9, abs=1e-12), (a["step"], k)
    if strategy == "fsdp":
        return
    # the same cut resumed by one process with per-rank seeds: warned, and the rollouts (so the metrics) differ
    cut_back(tmp_path / "a", tmp_path / "rank", 1)
    with caplog.at_level(logging.WARNING, logger="memagent.rl.rollout"):
        run(str(tmp_path / "rank"), 2, True, "rank")
    assert "saved by 2 process(es) with 1" in caplog.text
    assert metrics(tmp_path / "rank")[1]["loss"] != full[1]["loss"]
