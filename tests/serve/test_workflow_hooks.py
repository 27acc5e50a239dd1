"""The workflow hooks the service uses: on_step records (with chunk text) and resuming at a chunk offset."""
from __future__ import annotations

import json

from fakes import ScriptedBackend

from memagent.agent.workflow import AgentInput, MemoryAgent
from memagent.config import AgentConfig

DOC = " ".join(f"word{i}" for i in range(60))


def _agent(tok, **kw):
    # each reply depends on the whole prompt (so on the memory before it): the memories chain
    be = ScriptedBackend(tok, lambda prompt, _: f"m{len(prompt)} \\boxed{{{len(prompt) % 97}}}")
    return be, MemoryAgent(be, AgentConfig(chunk_tokens=16, memory_tokens=8, answer_tokens=8), **kw)


def test_on_step_gets_every_record_with_chunk_text(tiny_tokenizer, tmp_path):
    seen = []
    trace = tmp_path / "t.jsonl"
    be, agent = _agent(tiny_tokenizer, on_step=seen.append, trace_path=trace)
    res = agent.run([AgentInput("what?", DOC, "d")])[0]
    mem = [r for r in seen if r.get("kind") != "final"]
    assert len(mem) == res.num_chunks == len(be.batches) - 1
    assert [r["step"] for r in mem] == list(range(res.num_chunks))
    assert [r["chunk_start"] for r in mem] == [16 * i for i in range(res.num_chunks)]
    assert "".join(r["chunk_text"] for r in mem) == DOC  # the chunks tile the document
    assert seen[-1]["kind"] == "final"
    written = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(written) == len(seen) and all("chunk_text" not in r for r in written)  # off by default


def test_trace_chunks_writes_chunk_text(tiny_tokenizer, tmp_path):
    trace = tmp_path / "t.jsonl"
    _, agent = _agent(tiny_tokenizer, trace_path=trace, trace_chunks=True)
    agent.run([AgentInput("what?", DOC, "d")])
    mem = [json.loads(line) for line in trace.read_text().splitlines()][:-1]
    assert "".join(r["chunk_text"] for r in mem) == DOC


def test_resume_at_a_chunk_offset_makes_only_the_remaining_calls(tiny_tokenizer):
    full = []
    _, agent = _agent(tiny_tokenizer, on_step=full.append)
    whole = agent.run([AgentInput("what?", DOC, "d")])[0]
    n = whole.num_chunks
    assert n >= 4
    k = 2  # two chunks done: go on from the memory after step 1
    part = []
    be, agent = _agent(tiny_tokenizer, on_step=part.append)
    res = agent.run([AgentInput("what?", DOC, "d", memory=full[k - 1]["memory"], start_token=16 * k,
                                start_step=k)])[0]
    assert len(be.batches) == n - k + 1  # the remaining chunks, then the answer
    assert [r["step"] for r in part[:-1]] == list(range(k, n))
    assert part[:-1] == [dict(r, seconds=p["seconds"]) for r, p in zip(full[k:n], part[:-1])]
    assert (res.answer, res.memory, res.num_chunks) == (whole.answer, whole.memory, n)
