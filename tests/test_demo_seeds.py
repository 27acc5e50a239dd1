"""The demo over many seeds: mean ± sd (min) per cell and the issue's checks per seed, hand-worked."""
from __future__ import annotations

import json

import pytest

from memagent.demo.seeds import EVALUATION_SEEDS, TUNING_SEEDS, markdown, mean_sd_min, run_seeds, summarize


def _run(rl1, rl16, rl256, norl1, fc1, fc16, fc256, secs=600.0):
    acc = {"memagent-rl": {"1": rl1, "16": rl16, "256": rl256}, "memagent-no-rl": {"1": norl1, "16": 0.02, "256": 0.02},
           "full-context": {"1": fc1, "16": fc16, "256": fc256}}
    return {"accuracy": acc, "seconds": {"total": secs}, "peak_rss_mb": 580}


RUNS = {100: _run(1.00, 0.95, 0.90, 0.30, 0.99, 0.05, 0.02), 101: _run(0.96, 0.92, 0.80, 0.20, 0.93, 0.08, 0.03, 700)}


def test_the_protocol_keeps_evaluation_seeds_apart():
    assert len(EVALUATION_SEEDS) >= 5 and not set(EVALUATION_SEEDS) & set(TUNING_SEEDS) and 0 in TUNING_SEEDS


def test_mean_sd_min_by_hand():
    assert mean_sd_min([2.0, 4.0, 6.0]) == (4.0, 2.0, 2.0)  # sd = sqrt((4 + 0 + 4) / 2)
    assert mean_sd_min([5.0]) == (5.0, 0.0, 5.0)


def test_summary_cells_and_checks():
    s = summarize(RUNS)
    cell = s["accuracy"]["memagent-rl"]["1"]  # 100 and 96: mean 98, sd sqrt(8) = 2.83
    assert cell["mean"] == pytest.approx(98.0) and cell["sd"] == pytest.approx(8 ** 0.5) and cell["min"] == 96.0
    assert cell["n"] == 2
    assert s["checks"]["rl_minus_no_rl_1x"] == {100: pytest.approx(70.0), 101: pytest.approx(76.0)}
    assert s["checks"]["rl_drop_16x"] == {100: pytest.approx(5.0), 101: pytest.approx(4.0)}
    assert s["checks"]["rl_drop_256x"] == {100: pytest.approx(10.0), 101: pytest.approx(16.0)}
    assert s["checks"]["full_context_max_from_16x"] == {100: pytest.approx(5.0), 101: pytest.approx(8.0)}
    md = markdown(s)
    assert "| memagent-rl | 98.0 ± 2.8 (96.0) | 93.5 ± 2.1 (92.0) | 85.0 ± 7.1 (80.0) |" in md
    assert "| rl_drop_256x | 10.0 | 16.0 | 13.0 |" in md
    assert "| 101 | 700 | 580 |" in md


def test_run_seeds_reuses_finished_seeds_without_running_anything(tmp_path):
    for seed, res in RUNS.items():
        (tmp_path / f"seed-{seed}").mkdir()
        (tmp_path / f"seed-{seed}" / "results.json").write_text(json.dumps(res))
    summary = run_seeds([100, 101], tmp_path, log=lambda m: pytest.fail(f"nothing should run: {m}"))
    assert summary["seeds"] == [100, 101]
    assert (tmp_path / "seeds.md").read_text() == markdown(summary)
    assert json.loads((tmp_path / "seeds.json").read_text())["accuracy"]["full-context"]["1"]["min"] == pytest.approx(93.0)


def test_run_seeds_passes_the_ablation_flag_to_every_seed(tmp_path, monkeypatch):
    import subprocess

    started = []

    class FakeProc:
        def __init__(self, cmd, **kw):
            started.append(cmd)
            out = tmp_path / f"seed-{cmd[cmd.index('--seed') + 1]}"
            out.mkdir()
            (out / "results.json").write_text(json.dumps(RUNS[int(out.name[5:])]))
            self.returncode = 0

        def wait(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", FakeProc)
    run_seeds([100, 101], tmp_path, jobs=2, log=lambda m: None, pure_dapo=True)
    assert len(started) == 2 and all(cmd[-1] == "--pure-dapo" for cmd in started)


def test_pure_dapo_config_drops_only_the_value_copy_loss():
    from memagent.demo.pipeline import DemoConfig

    full, pure = DemoConfig.for_run(False, 200, "x"), DemoConfig.for_run(False, 200, "x", pure_dapo=True)
    assert full.rl_copy_coef > 0 and pure.rl_copy_coef == 0.0
    assert {k: v for k, v in vars(full).items() if k != "rl_copy_coef"} == \
        {k: v for k, v in vars(pure).items() if k != "rl_copy_coef"}
    assert DemoConfig.for_run(True, 1234, "x", pure_dapo=True).quick
