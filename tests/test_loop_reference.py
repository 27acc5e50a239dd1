"""The paper's loop (memagent.agent.workflow.memagent, its one definition) driven by hand, one document and one
model call at a time, against the same workflow behind the scheduler (many documents, batched or pipelined): the
same memory after every chunk and the same answer, document by document, under greedy decoding: on a
deterministic fake backend (lock-step batches and pipelined requests) and on the tiny model (lock-step batches of
several documents)."""
from __future__ import annotations

import hashlib

import pytest

from memagent.agent.protocol import Document, Reply
from memagent.agent.scheduler import call_seed
from memagent.agent.workflow import AgentInput, MemoryAgent, memagent
from memagent.backends.base import SamplingParams
from memagent.config import AgentConfig

from fakes import ScriptedBackend

TEMPLATE_MEM = "Q:{question}|M:{memory}|C:{chunk}|"
TEMPLATE_FIN = "Q:{question}|M:{memory}|A:"


def _words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i % 37}" for i in range(n))


def _reply(prompt: str, call: int) -> str:
    """A reply that depends on the prompt alone (never on the batch or the call index)."""
    question = prompt.split("|", 1)[0]
    digest = hashlib.sha256(prompt.encode()).hexdigest()
    if "|C:" not in prompt:  # the final call: an answer from the memory
        memory = prompt.split("|M:", 1)[1].split("|A:", 1)[0]
        return f"so \\boxed{{{memory.split()[-1] if memory.split() else 'none'}}}"
    if "empty" in question:
        return "   "  # an empty memory reply: the memory becomes ""
    if "long" in question:
        return " ".join(f"{digest[i:i + 3]}" for i in range(0, 60, 3))  # far over the M-token budget: cut
    chunk = prompt.split("|C:", 1)[1]
    return f"<think>scratch {digest[:6]}</think> seen {chunk.split()[0]} {digest[:4]}"


DOCS = [  # (question, document): several documents, one with an empty memory reply, one over budget, one long
    ("what is said?", _words(60, "a")),
    ("empty memory please", _words(45, "b")),
    ("long memory please", _words(70, "c")),
    ("many chunks?", _words(900, "d")),  # about 40 chunks of 20 tokens
    ("nothing to read?", ""),  # no chunk at all: answered from the empty memory
]


def _config(**kw) -> AgentConfig:
    base = dict(chunk_tokens=20, memory_tokens=8, answer_tokens=8, query_tokens=16, memory_template=TEMPLATE_MEM,
                final_template=TEMPLATE_FIN, empty_memory="EMPTY", temperature=0.0, max_batch_docs=3)
    base.update(kw)
    return AgentConfig(**base)


def _scheduler(backend, config, docs, schedule="auto"):
    agent = MemoryAgent(backend, config, keep_conversations=True, schedule=schedule)
    results = agent.run([AgentInput(q, d, f"doc{i}") for i, (q, d) in enumerate(docs)])
    return [([c.text for c in r.conversations if c.kind == "memory"], r.memory, r.answer, r.raw_answer)
            for r in results]


def read_and_answer(backend, cfg, question, document):
    """The workflow generator with no scheduler: each call sent alone as it is yielded, the k-th seeded as a
    one-document run seeds it; the memories are what the workflow kept of each memory reply."""
    loop = memagent(Document(0, AgentInput(question, document), cfg, backend.tokenizer), question)
    call, memories, k = next(loop), [], 1
    try:
        while True:
            params = SamplingParams(call.max_new_tokens, cfg.temperature, cfg.top_p, call_seed(cfg.seed, k))
            reply = Reply(backend.generate([call.prompt], params)[0])
            kind, call, k = call.kind, loop.send(reply), k + 1
            if kind == "memory":
                memories.append(reply.kept)
    except StopIteration as stop:
        return memories, stop.value.memory, stop.value.answer, stop.value.raw_answer


def _reference(backend, config, docs):
    return [read_and_answer(backend, config, q, d) for q, d in docs]


class _Concurrent(ScriptedBackend):
    max_concurrency = 4  # pipelined: single requests on a pool of threads (memagent.agent.scheduler.PoolSubmit)


@pytest.mark.parametrize("backend_cls, schedule", [(ScriptedBackend, "lockstep"), (_Concurrent, "pipelined")])
@pytest.mark.parametrize("think", ["strip", "keep"])
def test_reference_loop_equals_the_scheduler_on_a_fake_backend(tiny_tokenizer, backend_cls, schedule, think):
    cfg = _config(think=think)
    backend = backend_cls(tiny_tokenizer, _reply)
    expected = _scheduler(backend, cfg, DOCS, schedule)
    got = _reference(ScriptedBackend(tiny_tokenizer, _reply), cfg, DOCS)
    assert got == expected
    tok = lambda s: len(tiny_tokenizer(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    memories = {q: m for (q, _), (m, *_rest) in zip(DOCS, got)}
    assert memories["empty memory please"] == [""] * len(memories["empty memory please"]) != []
    assert all(0 < tok(m) <= cfg.memory_tokens for m in memories["long memory please"])  # cut to M tokens
    raw_long = tok(_reply("long memory please|M:|C:x|", 0))
    assert raw_long > cfg.memory_tokens  # the reply really was over the budget
    assert len(memories["many chunks?"]) >= 30 and memories["nothing to read?"] == []
    assert got[-1][2] == "EMPTY"  # no chunk: the final call saw the empty memory
    assert any(("think" in m) == (think == "keep") for m in memories["what is said?"])


def test_reference_loop_equals_the_scheduler_on_the_tiny_model(tiny_backend):
    cfg = AgentConfig(chunk_tokens=48, memory_tokens=12, answer_tokens=6, query_tokens=32, temperature=0.0,
                      max_batch_docs=3)
    docs = [("Which river flows past the mills?", _words(100, "river")),
            ("Who founded the company?", _words(30, "company")),
            ("How many albums were released?", _words(400, "album")),  # many chunks
            ("What is the village called?", _words(150, "village"))]
    expected = _scheduler(tiny_backend, cfg, docs)  # lock-step: batches of up to 3 documents, left-padded
    got = _reference(tiny_backend, cfg, docs)
    assert [len(m) for m, *_ in got] == [6, 2, 23, 9]  # chunks of 48 tokens
    assert got == expected
    assert len({a for *_, a in got}) > 1 or len({m for _, m, *_ in got}) > 1  # the documents got different replies
