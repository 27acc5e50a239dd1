"""Inspect AI as a client: `inspect eval --model memagent/<dir>` (our model API, found through the
`inspect_ai` entry point) and `--model openai-api/memagent/tiny` against `memagent serve`; a local task;
scores in Inspect's log; answers equal `memagent ask`'s; the memory timeline in each sample's metadata."""
from __future__ import annotations

import json
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

pytest.importorskip("inspect_ai")
pytest.importorskip("fastapi")

from harness_helpers import ask_answers, run, write_task  # noqa: E402
from plugin_dist import write_dist_info  # noqa: E402
sys.path.insert(0, str(Path(__file__).parents[1] / "serve"))  # tests/serve/serve_helpers.py (a top-level `serve` can be bench/serve.py)
from serve_helpers import SMALL, free_port, start_subprocess, wait_up  # noqa: E402

TASK = '''
import json
from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.scorer import includes
from inspect_ai.solver import generate


@task
def longqa():
    rows = [json.loads(line) for line in open({data!r})]
    return Task(dataset=MemoryDataset([Sample(id=i, input=f"{{r['document']}}\\n\\nQuestion: {{r['question']}}",
                                              target=r["answer"]) for i, r in enumerate(rows)]),
                solver=generate(), scorer=includes())
'''


def _entry_point_path(tmp_path: Path) -> str:
    """A folder for PYTHONPATH that declares our entry point when this checkout is not pip-installed with it."""
    if any(ep.name == "memagent" for ep in entry_points(group="inspect_ai")):
        return ""
    return str(write_dist_info(tmp_path / "eps", "memagent-harness-ep",
                               {"inspect_ai": {"memagent": "memagent.harness.inspect"}}, version="0.0"))


def _eval(tmp_path: Path, model: str, args: list[str], extra_env: dict) -> dict:
    folder = write_task(tmp_path / "task")
    task = folder / "longqa_task.py"
    task.write_text(TASK.format(data=str(folder / "data.jsonl")))
    run([sys.executable, "-m", "inspect_ai", "eval", str(task.relative_to(tmp_path)), "--model", model, *args, "--log-dir",
         str(tmp_path / "logs"), "--log-format", "json", "--display", "none"], tmp_path, extra_env, timeout=240)
    [log] = list((tmp_path / "logs").glob("*.json"))
    data = json.loads(log.read_text())
    assert data["status"] == "success", data.get("error")
    return data


@pytest.mark.slow
def test_inspect_with_the_memagent_model_api(tiny_model_dir, tmp_path, run_cli):
    import os

    eps = _entry_point_path(tmp_path)
    args = [x for k, v in dict(device="cpu", dtype="float32", **SMALL).items() for x in ("-M", f"{k}={v}")]
    env = {"PYTHONPATH": os.pathsep.join(p for p in (eps, os.environ.get("PYTHONPATH", "")) if p)} if eps else {}
    log = _eval(tmp_path, f"memagent/{tiny_model_dir}", args, env)
    assert "accuracy" in json.dumps(log["results"]["scores"])
    assert [s["output"]["completion"] for s in sorted(log["samples"], key=lambda s: s["id"])] == \
        ask_answers(run_cli, tiny_model_dir, tmp_path)
    meta = log["samples"][0]["metadata"]["memagent"]
    assert meta["calls"] == len(meta["steps"]) + 1 and meta["steps"][1]["chunk_start"] == SMALL["chunk_tokens"]
    assert meta["question"] == "Question: Which river is 0?" and meta["prompt_split"] == "auto"
    assert meta["prompt_tokens"] > 0 and meta["completion_tokens"] > 0 and "evidence" in meta


@pytest.mark.slow
def test_inspect_openai_api_against_memagent_serve(tiny_model_dir, tmp_path, run_cli):
    import httpx

    port = free_port()
    proc = start_subprocess(tiny_model_dir, tmp_path / "state", port)
    try:
        wait_up(f"http://127.0.0.1:{port}", proc=proc)
        log = _eval(tmp_path, "openai-api/memagent/tiny", [],
                    {"MEMAGENT_BASE_URL": f"http://127.0.0.1:{port}/v1", "MEMAGENT_API_KEY": "unused"})
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        proc.terminate()
        proc.wait(30)
    assert "accuracy" in json.dumps(log["results"]["scores"])
    assert [s["output"]["completion"] for s in sorted(log["samples"], key=lambda s: s["id"])] == \
        ask_answers(run_cli, tiny_model_dir, tmp_path)
    statuses = [line for line in metrics.splitlines() if line.startswith("memagent_requests_total{")]
    assert any('status="200"' in line for line in statuses)
    assert not any('status="4' in line for line in statuses), statuses
