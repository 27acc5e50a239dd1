"""The paper's read-write loop written out as a loop (paper: "The workflow"): one document, one model call at a
time, no scheduler.

    memory = empty memory
    for each chunk of N tokens:                       # the document, in order
        memory = model(question, memory, chunk)       # overwritten, cut to M tokens
    answer = extract(model(question, memory))

This is the reference for `memagent.agent.workflow.MemoryAgent`, which runs the same steps as a per-document state
machine behind the scheduler (memagent.agent.scheduler: many documents at once, batched or pipelined). Both use the
same prompts (memagent.agent.prompts.render of the config's templates), the same chunking
(memagent.agent.chunking.iter_chunks, after `document_tokens` middle truncation), the same memory cap
(`cap_tokens` to `memory_tokens`, after `think="strip"` removes a reply's think block) and the same answer
extraction (memagent.agent.answer.final_answer). Under greedy decoding the two give the same memory after every
chunk and the same answer (tests/test_loop_reference.py), as rl/algos.py's loop references check the vectorised
math. Its k-th call is seeded as a one-document run of the scheduler seeds it: `call_seed(config.seed, k)`.

Left out on purpose: traces, conversations for training, resuming, failures, the window check; use
MemoryAgent (or `memagent ask`) for work.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from memagent.agent.answer import final_answer, strip_think
from memagent.agent.chunking import DocumentSource, iter_chunks, middle_truncate
from memagent.agent.prompts import render
from memagent.agent.scheduler import call_seed
from memagent.agent.workflow import cap_tokens
from memagent.backends.base import Backend, SamplingParams
from memagent.config import AgentConfig

__all__ = ["LoopResult", "read_and_answer"]


@dataclass
class LoopResult:
    answer: str | None  # under config.answer_protocol; None when the reply holds none
    raw_answer: str  # the final reply as the model wrote it
    memory: str  # the final memory
    memories: list[str] = field(default_factory=list)  # the memory after each chunk, in order (one per chunk)


def read_and_answer(backend: Backend, config: AgentConfig, question: str, document: DocumentSource) -> LoopResult:
    """Read `document` chunk by chunk, rewriting the memory after each, then answer `question` from the memory."""
    cfg, tok = config, backend.tokenizer
    calls = 0

    def generate(prompt: str, max_new_tokens: int) -> str:
        nonlocal calls
        calls += 1
        params = SamplingParams(max_new_tokens, cfg.temperature, cfg.top_p, call_seed(cfg.seed, calls))
        return backend.generate([prompt], params)[0].text

    if cfg.document_tokens is not None:
        document = middle_truncate(document, tok, cfg.document_tokens).context
    memory, memories = cfg.empty_memory, []
    for chunk in iter_chunks(document, tok, cfg.chunk_tokens):
        reply = generate(render(cfg.memory_template, question=question, memory=memory, chunk=chunk.text),
                         cfg.memory_tokens)
        if cfg.think == "strip":
            reply, _ = strip_think(reply)
        memory, _, _ = cap_tokens(reply.strip(), tok, cfg.memory_tokens)  # at most M tokens, whatever came back
        memories.append(memory)
    raw = generate(render(cfg.final_template, question=question, memory=memory), cfg.answer_tokens)
    answer, _ = final_answer(raw, cfg.answer_protocol, cfg.think)
    return LoopResult(answer, raw, memory, memories)
