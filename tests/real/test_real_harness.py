"""The harness entry points with the real pretrained model (SmolLM2-135M-Instruct): lm-eval's CLI with the
registered `memagent` model, and `inspect eval --model memagent/<dir>`, each finishing the small local task of
tests/harness; their answers equal `memagent ask`'s on the same prompts."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("lm_eval")
pytest.importorskip("inspect_ai")
sys.path.insert(0, str(Path(__file__).parents[1] / "harness"))

import harness_helpers  # noqa: E402
from harness_helpers import ask_answers, lm_eval_samples, run, write_task  # noqa: E402

REAL = dict(chunk_tokens=128, memory_tokens=16, answer_tokens=8, query_tokens=64)  # about 2 chunks a document


_ASKED: dict[str, list[str]] = {}  # `memagent ask`'s answers, computed once for both harnesses


def ask_once(run_cli, model_dir: Path, folder: Path) -> list[str]:
    if str(model_dir) not in _ASKED:
        _ASKED[str(model_dir)] = ask_answers(run_cli, model_dir, folder)
    return _ASKED[str(model_dir)]


@pytest.fixture
def real_budgets(monkeypatch):
    monkeypatch.setattr(harness_helpers, "SMALL", REAL)  # ask_answers' flags
    return REAL


def test_lm_eval_with_the_memagent_model(real_model_dir, real_budgets, tmp_path, run_cli):
    task = write_task(tmp_path / "task")
    budgets = ",".join(f"{k}={v}" for k, v in real_budgets.items())
    run([sys.executable, "-m", "memagent.harness.lm_eval_cli", "--model", "memagent", "--model_args",
         f"model={real_model_dir},device=cpu,dtype=float32,{budgets}", "--tasks", "longqa_local",
         "--include_path", str(task), "--output_path", str(tmp_path / "out"), "--log_samples"], tmp_path, timeout=900)
    results, samples = lm_eval_samples(tmp_path / "out")
    assert 0.0 <= results["results"]["longqa_local"]["exact_match,none"] <= 1.0
    got = [s["resps"][0][0] for s in sorted(samples, key=lambda s: s["doc_id"])]
    assert len(got) == 3 and got == ask_once(run_cli, real_model_dir, tmp_path)


def test_inspect_with_the_memagent_model_api(real_model_dir, real_budgets, tmp_path, run_cli):
    from test_inspect import _entry_point_path, _eval

    eps = _entry_point_path(tmp_path)
    args = [x for k, v in dict(device="cpu", dtype="float32", **real_budgets).items() for x in ("-M", f"{k}={v}")]
    env = {"PYTHONPATH": os.pathsep.join(p for p in (eps, os.environ.get("PYTHONPATH", "")) if p)} if eps else {}
    log = _eval(tmp_path, f"memagent/{real_model_dir}", args, env)
    assert "accuracy" in json.dumps(log["results"]["scores"])
    got = [s["output"]["completion"] for s in sorted(log["samples"], key=lambda s: s["id"])]
    assert len(got) == 3 and got == ask_once(run_cli, real_model_dir, tmp_path)
    meta = log["samples"][0]["metadata"]["memagent"]
    assert meta["calls"] == len(meta["steps"]) + 1 and meta["steps"][1]["chunk_start"] == REAL["chunk_tokens"]
