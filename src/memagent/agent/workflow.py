"""The read-write loop (paper: "The workflow"), the one definition of it: each chunk is one independent call that
overwrites a fixed-size memory; a last call answers from the question and the final memory.

    memory = empty memory
    for each chunk of C tokens:                       # the document, in order
        memory = model(question, memory, chunk)       # overwritten, cut to M tokens
    answer = extract(model(question, memory))

`memagent` is that loop as a workflow (memagent.agent.protocol): the default of every command. `read` (the chunk
loop) and `answer` (the final call) are its two halves, which `lookup` and `skim` reuse with `yield from`. The
scheduler (memagent.agent.scheduler) runs many documents at once: on an in-process backend the ready prompts of
all documents in flight form one batch (memory prompts in one, final prompts in another); on a concurrent (HTTP)
backend each document's next call goes out as soon as its previous reply is in. Per call the work is O(C + M);
per document O(N).

Departures from the reference code: the memory is held to at most M tokens whatever the backend returns (a
longer reply is re-tokenised and cut, and the cut is recorded); documents are read as streams; every memory
update records the token offset of its chunk (an evidence pointer) and, for a PDF, HTML or EPUB document, the
page, heading or chapter it came from (`source`, memagent.documents).

Reasoning models: with `AgentConfig.think == "strip"` each reply loses everything up to its last `</think>`
before the memory cap and before answer extraction (as the reference evaluation does); the trace's
`think_removed` field says for which calls it happened.
"""
from __future__ import annotations

import logging
from typing import Any, Generator, Iterable, Sequence

from memagent.agent.answer import final_answer, strip_think
from memagent.agent.chunking import Chunk
from memagent.prompts import render
from memagent.agent.protocol import (AgentInput, AgentResult, Answer, BudgetError, Call, Conversation,  # noqa: F401
                                     Document, Reply, template_overhead, workflow)
from memagent.agent.runner import Runner
from memagent.agent.scheduler import call_seed  # noqa: F401  (re-exported)
from memagent.backends.base import Backend
from memagent.config import AgentConfig

log = logging.getLogger(__name__)

Reading = Generator[Call, Reply, Any]


@workflow(resumable=True)
def memagent(doc: Document, question: str, options: Any = None) -> Reading:
    """The paper's workflow: read every chunk into the memory, then answer from it (K + 1 calls)."""
    memory = yield from read(doc, question, doc.chunks(), doc.memory)
    return (yield from answer(doc, question, memory, doc.num_chunks))


def read(doc: Document, question: str, chunks: Iterable[Chunk], memory: str) -> Reading:
    """Read `chunks` in order, each a memory update (step = the chunk's number) that overwrites `memory` with the
    reply cut to M tokens (after its think block under think="strip"); returns the last memory."""
    cfg = doc.config
    for chunk in chunks:
        prompt = render(cfg.memory_template, question=question, memory=memory, chunk=chunk.text)
        reply = yield Call("memory", prompt, cfg.memory_tokens, step=chunk.index, chunk=chunk)
        text, think_removed = strip_think(reply.text) if cfg.think == "strip" else (reply.text, False)
        memory, n, truncated = cap_tokens_many([text.strip()], doc.tokenizer, cfg.memory_tokens)[0]
        truncated = truncated or reply.gen.finish_reason == "length"  # stopped at M tokens: cut, not ended
        if truncated:
            log.info("document %s step %d: memory cut to %d tokens", doc.id, chunk.index, cfg.memory_tokens)
        reply.keep(memory, truncated, memory_tokens=n, memory=memory, truncated=truncated, think_removed=think_removed)
    return memory


def answer(doc: Document, question: str, memory: str, num_chunks: int) -> Reading:
    """The final call: the answer extracted from the model's reply to the question and `memory`."""
    cfg = doc.config
    reply = yield Call("final", render(cfg.final_template, question=question, memory=memory), cfg.answer_tokens,
                       step=num_chunks)
    found, think_removed = final_answer(reply.text, cfg.answer_protocol, cfg.think)
    reply.keep(reply.text, memory_tokens=doc.count(memory), answer=found, raw_answer=reply.text,
               think_removed=think_removed)
    return Answer(found, reply.text, memory, num_chunks, think_removed)


class MemoryAgent(Runner):
    """The paper's workflow ready to run: `Runner(memagent, backend, config, **options)`, where `options` are the
    shared run options (memagent.agent.protocol.WorkflowOptions: keep_conversations, on_step, schedule, ...)."""

    def __init__(self, backend: Backend, config: AgentConfig | None = None, **options: Any) -> None:
        super().__init__(memagent, backend, config, **options)


def cap_tokens(text: str, tokenizer: Any, limit: int) -> tuple[str, int, bool]:
    """Cut `text` to at most `limit` tokens of `tokenizer`; returns (text, n_tokens, truncated).

    The cut is re-checked after decoding (a decode/encode round trip can change the count), so
    the returned text re-encodes to at most `limit` tokens.
    """
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= limit:
        return text, len(ids), False
    keep = limit
    while keep > 0:
        cut = tokenizer.decode(ids[:keep])
        n = len(tokenizer(cut, add_special_tokens=False)["input_ids"])
        if n <= limit:
            return cut, n, True
        keep -= max(1, n - limit)
    return "", 0, True


def cap_tokens_many(texts: Sequence[str], tokenizer: Any, limit: int) -> list[tuple[str, int, bool]]:
    """`cap_tokens` for many texts: one tokenizer call for all, the cut only for those over `limit`."""
    if not texts:
        return []
    counts = [len(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]
    return [(t, n, False) if n <= limit else cap_tokens(t, tokenizer, limit) for t, n in zip(texts, counts)]
