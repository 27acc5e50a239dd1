"""The baselines under a profile: their own template, answer budget and answer protocol; MemAgent's document cut."""
from __future__ import annotations

import json

from memagent.agent.workflow import AgentInput, MemoryAgent
from memagent.config import AgentConfig
from memagent.eval.sweep import SweepConfig, run_sweep

from fakes import ScriptedBackend


def test_baselines_use_their_template_budget_and_the_answer_protocol(tiny_tokenizer, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(dict(id="a", task="qa", question="Where?", answers=["Paris", "Rome"],
                                    context="Paris is a city. " * 5, metric="sub_em", length=1)) + "\n")
    backend = ScriptedBackend(tiny_tokenizer, lambda p, c: "<think>the answer is Rome</think>so the answer is Paris.",
                              max_window=10_000)
    agent = AgentConfig(chunk_tokens=50, memory_tokens=8, answer_tokens=4, query_tokens=16, answer_protocol="phrase")
    cfg = SweepConfig("scripted", methods=["full-context"], agent=agent, window=400, baseline_answer_tokens=7,
                      baseline_template="T {question} C {context} END")
    results = run_sweep(backend, [data], tmp_path / "out", cfg)
    [rec] = [json.loads(line) for line in results.read_text().splitlines()]
    assert rec["prediction"] == "Paris" and rec["score"] == 1.0  # the phrase after the think block
    assert backend.params[0].max_new_tokens == 7  # the baselines' own answer budget
    [prompt] = backend.batches[0]
    assert prompt.startswith("T Where? C Paris is a city.") and prompt.endswith("END")


def test_document_tokens_cut_the_document_in_the_middle_before_reading(tiny_tokenizer):
    words = [f"w{i}" for i in range(200)]
    n_all = len(tiny_tokenizer(" ".join(words), add_special_tokens=False)["input_ids"])
    backend = ScriptedBackend(tiny_tokenizer, lambda p, c: "m" if "Updated memory" in p else "\\boxed{x}")
    cfg = AgentConfig(chunk_tokens=40, memory_tokens=8, answer_tokens=8, query_tokens=16, document_tokens=60)
    [res] = MemoryAgent(backend, cfg).run([AgentInput("q", " ".join(words))])
    assert n_all > 200 and res.num_chunks == 2  # 60 tokens in chunks of 40, not ceil(n_all / 40)
    chunks = "".join(p.split("<section>\n")[1].split("\n</section>")[0] for b in backend.batches[:-1] for p in b)
    assert chunks.startswith("w0 w1") and chunks.rstrip().endswith("w199") and "w100 " not in chunks
