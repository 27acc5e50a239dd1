"""--speculate ngram on the real model (SmolLM2-135M-Instruct): greedy memories and answers token-identical to plain
decoding over several real-essay documents, read in one batch; drafts proposed and accepted. Slow: real-model calls."""
from __future__ import annotations

import json

import pytest
from real_model import essay_document

from memagent.agent.protocol import AgentInput
from memagent.agent.registry import build_workflow
from memagent.backends.base import SamplingParams
from memagent.backends.hf import TransformersBackend
from memagent.config import AgentConfig

pytestmark = pytest.mark.slow

NEEDLES = ["The secret code of the blue harbor is 4417.", "The red lighthouse opens at 7 in the morning.",
           "Mira's favourite number is 928."]
QUESTIONS = ["What is the secret code of the blue harbor?", "When does the red lighthouse open?",
             "What is Mira's favourite number?"]


def _read(backend, tmp_path, name):
    cfg = AgentConfig(chunk_tokens=160, memory_tokens=48, answer_tokens=24)
    trace = tmp_path / f"{name}.jsonl"
    wf = build_workflow("memagent", backend, cfg, trace_path=trace, keep_conversations=True)
    items = [AgentInput(q, essay_document(220 + 40 * i, needle=n, depth=0.3 + 0.2 * i), str(i))
             for i, (q, n) in enumerate(zip(QUESTIONS, NEEDLES))]
    results = wf.run(items)
    return results, [json.loads(line) for line in trace.read_text().splitlines()]


def test_greedy_memories_and_answers_are_token_identical(real_backend, tmp_path):
    spec = TransformersBackend(real_backend.model, real_backend.tokenizer, speculate="ngram")
    plain_results, plain_trace = _read(real_backend, tmp_path, "plain")
    spec_results, spec_trace = _read(spec, tmp_path, "spec")
    for a, b in zip(plain_results, spec_results):
        assert [c.response_ids for c in b.conversations] == [c.response_ids for c in a.conversations]
        assert (b.answer, b.memory) == (a.answer, a.memory)
        assert a.num_chunks >= 2
    memory_rows = [r for r in spec_trace if r.get("kind") != "final"]
    assert len(spec_trace) == len(plain_trace) >= 9
    proposed = sum(r["draft_proposed"] for r in spec_trace)
    accepted = sum(r["draft_accepted"] for r in spec_trace)
    assert proposed > 0 and 0 < accepted <= proposed and all("draft_proposed" not in r for r in plain_trace)
    assert sum(r["draft_accepted"] for r in memory_rows) > 0  # memories copy spans of what they read


def test_a_copied_passage_is_accepted_in_long_runs(real_backend):
    """A prompt that asks to repeat a passage: most drafted tokens are the model's own, so few passes decode many
    tokens (the case speculation is for); the tokens are plain decoding's."""
    spec = TransformersBackend(real_backend.model, real_backend.tokenizer, speculate="ngram")
    passage = essay_document(60)
    prompt = f"Repeat the following text exactly, word for word.\n\n{passage}"
    params = SamplingParams(max_new_tokens=48)
    a, b = real_backend.generate([prompt], params)[0], spec.generate([prompt], params)[0]
    assert b.token_ids == a.token_ids
    assert b.draft_accepted >= 0.5 * b.draft_proposed > 0
