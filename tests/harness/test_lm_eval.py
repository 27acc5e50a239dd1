"""lm-evaluation-harness as a client: its `local-chat-completions` model against `memagent serve`, and the
registered `memagent` model in process (lm-eval's real CLI, a local task); answers equal `memagent ask`'s;
loglikelihood equals a hand computation; loglikelihood_rolling is refused."""
from __future__ import annotations

from pathlib import Path

import math
import sys

import pytest

pytest.importorskip("lm_eval")
pytest.importorskip("fastapi")

from harness_helpers import BUDGETS, ask_answers, lm_eval_samples, prompt, rows, run, write_task  # noqa: E402
sys.path.insert(0, str(Path(__file__).parents[1] / "serve"))  # tests/serve/serve_helpers.py (a top-level `serve` can be bench/serve.py)
from serve_helpers import SMALL, free_port, start_subprocess, wait_up  # noqa: E402


def _metric(results: dict) -> float:
    return results["results"]["longqa_local"]["exact_match,none"]


@pytest.mark.slow
def test_local_chat_completions_against_memagent_serve(tiny_model_dir, tmp_path, run_cli):
    import httpx

    task = write_task(tmp_path / "task")
    port = free_port()
    proc = start_subprocess(tiny_model_dir, tmp_path / "state", port)
    try:
        wait_up(f"http://127.0.0.1:{port}", proc=proc)
        run([sys.executable, "-m", "lm_eval", "--model", "local-chat-completions", "--model_args",
             f"model=tiny,base_url=http://127.0.0.1:{port}/v1/chat/completions,num_concurrent=2",
             "--apply_chat_template", "--tasks", "longqa_local", "--include_path", str(task),
             "--output_path", str(tmp_path / "out"), "--log_samples"], tmp_path, timeout=240)
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        proc.terminate()
        proc.wait(30)
    results, samples = lm_eval_samples(tmp_path / "out")
    assert 0.0 <= _metric(results) <= 1.0
    got = [s["resps"][0][0] for s in sorted(samples, key=lambda s: s["doc_id"])]
    assert got == ask_answers(run_cli, tiny_model_dir, tmp_path)
    statuses = [line for line in metrics.splitlines() if line.startswith("memagent_requests_total{")]
    assert any('status="200"' in line for line in statuses)
    assert not any('status="4' in line for line in statuses), statuses  # no 4xx in the run


@pytest.mark.slow
def test_registered_memagent_model_in_process(tiny_model_dir, tmp_path, run_cli):
    task = write_task(tmp_path / "task")
    run([sys.executable, "-m", "memagent.harness.lm_eval_cli", "--model", "memagent", "--model_args",
         f"model={tiny_model_dir},device=cpu,dtype=float32,{BUDGETS}", "--tasks", "longqa_local",
         "--include_path", str(task), "--output_path", str(tmp_path / "out"), "--log_samples"], tmp_path, timeout=240)
    results, samples = lm_eval_samples(tmp_path / "out")
    assert 0.0 <= _metric(results) <= 1.0
    got = [s["resps"][0][0] for s in sorted(samples, key=lambda s: s["doc_id"])]
    assert got == ask_answers(run_cli, tiny_model_dir, tmp_path)


def test_loglikelihood_equals_a_hand_computation(tiny_model_dir, tiny_backend):
    import torch

    from memagent.agent.workflow import AgentInput, MemoryAgent
    from memagent.config import AgentConfig
    from memagent.harness.lm_eval import MemAgentLM

    lm = MemAgentLM(model=str(tiny_model_dir), device="cpu", dtype="float32", **SMALL)
    row = rows(1)[0]

    class Req:
        args = (prompt(row), " river0 city")

    [(score, greedy)] = lm.loglikelihood([Req()])
    # by hand: the final memory of a plain run, the answer prompt through the chat template, then the
    # continuation's tokens scored one at a time (a growing prefix each time)
    r = MemoryAgent(tiny_backend, AgentConfig(**SMALL)).run([AgentInput("Question: " + row["question"], row["document"])])[0]
    final = AgentConfig(**SMALL).final_template.replace("{question}", r.question).replace("{memory}", r.memory)
    tok = tiny_backend.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": final}], add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    total = 0.0
    for t in tok(" river0 city", add_special_tokens=False)["input_ids"]:
        with torch.no_grad():
            logits = tiny_backend.model(input_ids=torch.tensor([ids])).logits[0, -1].double()
        total += (logits[t] - torch.logsumexp(logits, 0)).item()
        ids.append(t)
    assert math.isclose(score, total, rel_tol=1e-4, abs_tol=1e-4), (score, total)
    assert score < 0 and isinstance(greedy, bool)


def test_loglikelihood_rolling_is_refused(tiny_model_dir):
    from memagent.errors import InputError
    from memagent.harness.lm_eval import MemAgentLM

    lm = MemAgentLM(model=str(tiny_model_dir), device="cpu", dtype="float32", **SMALL)
    with pytest.raises(InputError, match="loglikelihood_rolling .* not meaningful for MemAgent"):
        lm.loglikelihood_rolling([])
    with pytest.raises(InputError, match="unknown memagent model argument"):
        MemAgentLM(model=str(tiny_model_dir), bogus=1)
    with pytest.raises(Exception, match="unknown workflow 'nope'; valid workflows: memagent"):
        MemAgentLM(model=str(tiny_model_dir), workflow="nope")
