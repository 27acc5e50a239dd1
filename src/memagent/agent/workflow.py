"""The read-write loop (paper: "The workflow"): each chunk is one independent call that
overwrites a fixed-size memory; a last call answers from the question and the final memory.

Many documents run at once: at every step, the memory prompts of all active documents go to the
backend as one batch (and the final prompts of those that ran out of chunks as another), so
documents of different lengths finish at different steps while the batch stays full. Per call
the work is O(C + M); per document O(N).

Departures from the reference code: the memory is held to at most M tokens whatever the backend
returns (a longer reply is re-tokenised and cut, and the cut is recorded); documents are read as
streams; every memory update records the token offset of its chunk (an evidence pointer).

Reasoning models: with `AgentConfig.think == "strip"` each reply loses everything up to its last
`</think>` before the memory cap and before answer extraction (as the reference evaluation does);
the trace's `think_removed` field says for which calls it happened.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TextIO

from memagent.agent.answer import final_answer, strip_think
from memagent.agent.chunking import Chunk, DocumentSource, iter_chunks, middle_truncate
from memagent.agent.prompts import render
from memagent.agent.trace import TraceWriter
from memagent.backends.base import Backend, SamplingParams
from memagent.config import AgentConfig
from memagent.errors import MemAgentError

log = logging.getLogger(__name__)


class BudgetError(MemAgentError, ValueError):
    """A question, or the window budget, does not fit; nothing was sent to the model."""


@dataclass
class AgentInput:
    question: str
    document: DocumentSource  # text, a path, an open file, or an iterable of text blocks
    doc_id: str = ""
    memory: str | None = None  # the memory to start from (e.g. one saved to go on reading); None: empty_memory
    start_token: int = 0  # go on reading at this token offset (a chunk boundary: step * chunk_tokens)
    start_step: int = 0  # the step number of the chunk at start_token (resuming: the steps already done)


@dataclass
class Conversation:
    """One independent model call of a rollout (a memory update or the final answer)."""

    kind: str  # "memory" | "final"
    step: int  # chunk index for memory updates; number of chunks for the final call
    prompt: str
    prompt_ids: list[int] | None  # [T_in], as the model saw them (chat template included)
    response_ids: list[int]  # [T_out], terminating EOS included
    logprobs: list[float] | None  # [T_out], sampling-time log-probs when the backend gives them
    text: str  # the reply (for memory updates: the memory kept, after the M-token cap)
    truncated: bool = False  # the reply was longer than M tokens and was cut


@dataclass
class AgentResult:
    doc_id: str
    question: str
    answer: str | None  # the final answer under config.answer_protocol; None when the model wrote none
    raw_answer: str
    memory: str  # the final memory
    num_chunks: int
    conversations: list[Conversation] = field(default_factory=list)  # memory updates, then final
    think_removed: bool = False  # a think block was cut from the final reply before extraction


@dataclass
class _Doc:
    pos: int
    item: AgentInput
    chunks: Iterator[Chunk]
    next_chunk: Chunk | None
    memory: str
    step: int = 0
    conversations: list[Conversation] = field(default_factory=list)
    memory_tokens: int | None = None  # of `memory`, once a memory step has counted them


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


def call_seed(seed: int | None, call: int) -> int | None:
    """The sampling seed of the `call`-th model call (1, 2, ...) of a run under the config's `seed` (None:
    unseeded). A run's seeds depend on its seed and its inputs only, not on what the agent ran before."""
    return None if seed is None else seed * 1_000_003 + call


class MemoryAgent:
    """Answer questions over documents of any length with a fixed-size, overwritten memory.

    keep_conversations: keep every call's prompt/response ids in the result (the trainer needs
    them; for inference over long documents leave it off, so RAM does not grow with length).
    on_step: called with each trace record as it is made (memory records carry `chunk_text`); an
    exception it raises stops the run (e.g. a cancelled job).
    trace_chunks: also write each memory record's `chunk_text` to the trace file.
    """

    def __init__(
        self,
        backend: Backend,
        config: AgentConfig | None = None,
        *,
        trace_path: str | Path | TextIO | None = None,  # a path (rewritten) or an open text stream
        progress: bool = False,
        errors: str = "strict",
        keep_conversations: bool = False,
        on_step: Callable[[dict[str, Any]], None] | None = None,
        trace_chunks: bool = False,
    ) -> None:
        self.backend = backend
        self.config = config or AgentConfig()
        self.trace_path = trace_path
        self.progress = progress
        self.errors = errors
        self.keep_conversations = keep_conversations
        self.on_step = on_step
        self.trace_chunks = trace_chunks

    # -- checks before any model call -----------------------------------------------------
    def check_budget(self, items: Sequence[AgentInput]) -> None:
        """Raise BudgetError for a question over its budget or a window that cannot hold a call."""
        cfg, tok = self.config, self.backend.tokenizer
        for it in items:
            n = len(tok(it.question, add_special_tokens=False)["input_ids"])
            if n > cfg.query_tokens:
                raise BudgetError(
                    f"question of document {it.doc_id or '#?'} has {n} tokens, over its budget of "
                    f"{cfg.query_tokens}; shorten it or raise --query-tokens"
                )
            if not it.question.strip():
                raise BudgetError(f"question of document {it.doc_id or '#?'} is empty")
            if it.memory is not None:
                n = len(tok(it.memory, add_special_tokens=False)["input_ids"])
                if n > cfg.memory_tokens:
                    raise BudgetError(f"starting memory of document {it.doc_id or '#?'} has {n} tokens, over the "
                                      f"memory budget of {cfg.memory_tokens}; shorten it or raise --memory-tokens")
        window = self.backend.max_window
        if window is None:
            return
        mem_overhead = self.backend.prompt_length(render(cfg.memory_template, question="", memory="", chunk=""))
        fin_overhead = self.backend.prompt_length(render(cfg.final_template, question="", memory=""))
        need_mem = mem_overhead + cfg.query_tokens + cfg.chunk_tokens + 2 * cfg.memory_tokens
        need_fin = fin_overhead + cfg.query_tokens + cfg.memory_tokens + cfg.answer_tokens
        need = max(need_mem, need_fin)
        if need > window:
            raise BudgetError(
                f"a call needs up to {need} tokens (template {mem_overhead} + query {cfg.query_tokens} + "
                f"chunk {cfg.chunk_tokens} + memory {cfg.memory_tokens} + output {max(cfg.memory_tokens, cfg.answer_tokens)}) "
                f"but the model's window is {window}; lower --chunk-tokens or --memory-tokens"
            )

    # -- the loop ---------------------------------------------------------------------------
    def run(self, items: Sequence[AgentInput],
            on_result: Callable[[AgentResult], None] | None = None) -> list[AgentResult]:
        """Run every (question, document) pair; results come back in input order.

        on_result: called with each result as soon as its document finishes (finishing order), e.g. to
        write it out, so an error in a later document does not lose it."""
        items = [replace(it, doc_id=it.doc_id or str(i)) for i, it in enumerate(items)]
        self.check_budget(items)
        trace = TraceWriter(self.trace_path) if self.trace_path else None
        results: list[AgentResult | None] = [None] * len(items)
        pending = deque(enumerate(items))
        active: list[_Doc] = []
        bar = _Progress(len(items)) if self.progress else None
        call = 0  # model calls (batches) of this run so far: with the config's seed, it seeds the next one
        try:
            while pending or active:
                while pending and len(active) < self.config.max_batch_docs:
                    active.append(self._start(*pending.popleft()))
                reading = [d for d in active if d.next_chunk is not None]
                done = [d for d in active if d.next_chunk is None]
                if reading:
                    call += 1
                    self._memory_step(reading, trace, call)
                    if bar:
                        bar.chunks(len(reading))
                if done:
                    call += 1
                    for d, res in zip(done, self._final_step(done, trace, call)):
                        results[d.pos] = res
                        if on_result is not None:
                            on_result(res)
                    finished = {id(d) for d in done}
                    active = [d for d in active if id(d) not in finished]
                    if bar:
                        bar.docs(len(done))
        finally:
            if trace:
                trace.close()
            if bar:
                bar.close()
        return results  # type: ignore[return-value]

    def _start(self, pos: int, item: AgentInput) -> _Doc:
        document = item.document
        if self.config.document_tokens is not None:
            document = middle_truncate(document, self.backend.tokenizer, self.config.document_tokens).context
        chunks = iter_chunks(document, self.backend.tokenizer, self.config.chunk_tokens, errors=self.errors)
        first = next(chunks, None)
        while first is not None and first.start_token < item.start_token:  # resuming: skip the chunks read
            first = next(chunks, None)
        if first is None and item.start_token == 0:
            log.warning("document %s is empty: answering from an empty memory", item.doc_id)
        return _Doc(pos, item, chunks, first, self.config.empty_memory if item.memory is None else item.memory,
                    step=item.start_step)

    def _emit(self, trace: TraceWriter | None, record: dict[str, Any], chunk_text: str | None = None) -> None:
        """Write `record` to the trace (with the chunk's text under trace_chunks) and pass it to on_step."""
        full = record if chunk_text is None else dict(record, chunk_text=chunk_text)
        if trace:
            trace.write(full if self.trace_chunks else record)
        if self.on_step is not None:
            self.on_step(full)

    def _params(self, max_new_tokens: int, call: int) -> SamplingParams:
        cfg = self.config
        return SamplingParams(max_new_tokens, cfg.temperature, cfg.top_p, call_seed(cfg.seed, call))

    def _memory_step(self, docs: list[_Doc], trace: TraceWriter | None, call: int) -> None:
        cfg, tok = self.config, self.backend.tokenizer
        prompts = [
            render(cfg.memory_template, question=d.item.question, memory=d.memory, chunk=d.next_chunk.text)
            for d in docs
        ]
        t0 = time.perf_counter()
        gens = self.backend.generate(prompts, self._params(cfg.memory_tokens, call))
        seconds = time.perf_counter() - t0
        replies = [strip_think(g.text) if cfg.think == "strip" else (g.text, False) for g in gens]
        capped = cap_tokens_many([text.strip() for text, _ in replies], tok, cfg.memory_tokens)
        for d, prompt, gen, (_, think_removed), (memory, n_mem, truncated) in zip(docs, prompts, gens, replies, capped):
            chunk = d.next_chunk
            if truncated:
                log.info("document %s step %d: memory cut to %d tokens", d.item.doc_id, d.step, cfg.memory_tokens)
            n_prompt = len(gen.prompt_token_ids) if gen.prompt_token_ids is not None else self.backend.prompt_length(prompt)
            if trace or self.on_step:
                self._emit(trace, dict(doc_id=d.item.doc_id, step=d.step, chunk_start=chunk.start_token,
                                       chunk_tokens=len(chunk.token_ids), prompt_tokens=n_prompt,
                                       memory_tokens=n_mem, memory=memory, truncated=truncated,
                                       think_removed=think_removed, seconds=round(seconds, 6),
                                       batch_size=len(docs)), chunk.text)
            if self.keep_conversations:
                d.conversations.append(Conversation("memory", d.step, prompt, gen.prompt_token_ids,
                                                    gen.token_ids, gen.logprobs, memory, truncated))
            d.memory, d.memory_tokens = memory, n_mem
            d.step += 1
            d.next_chunk = next(d.chunks, None)

    def _final_step(self, docs: list[_Doc], trace: TraceWriter | None, call: int) -> list[AgentResult]:
        cfg = self.config
        prompts = [render(cfg.final_template, question=d.item.question, memory=d.memory) for d in docs]
        t0 = time.perf_counter()
        gens = self.backend.generate(prompts, self._params(cfg.answer_tokens, call))
        seconds = time.perf_counter() - t0
        out = []
        for d, prompt, gen in zip(docs, prompts, gens):
            answer, think_removed = final_answer(gen.text, cfg.answer_protocol, cfg.think)
            n_prompt = len(gen.prompt_token_ids) if gen.prompt_token_ids is not None else self.backend.prompt_length(prompt)
            if trace or self.on_step:
                self._emit(trace, dict(doc_id=d.item.doc_id, step=d.step, kind="final", prompt_tokens=n_prompt,
                                 memory_tokens=d.memory_tokens if d.memory_tokens is not None else
                                 len(self.backend.tokenizer(d.memory, add_special_tokens=False)["input_ids"]),
                                 answer=answer, raw_answer=gen.text, think_removed=think_removed, seconds=round(seconds, 6),
                                 batch_size=len(docs)))
            if self.keep_conversations:
                d.conversations.append(Conversation("final", d.step, prompt, gen.prompt_token_ids,
                                                    gen.token_ids, gen.logprobs, gen.text))
            out.append(AgentResult(d.item.doc_id, d.item.question, answer, gen.text, d.memory, d.step,
                                   d.conversations, think_removed))
        return out


class _Progress:
    """Documents finished and chunks read, on stderr (a bar on a terminal, a plain line every 5% in a log)."""

    def __init__(self, n_docs: int) -> None:
        from memagent.progress import StepProgress

        self._p = StepProgress("read", n_docs, unit="documents")
        self._n = 0

    def chunks(self, n: int) -> None:
        self._n += n
        self._p.update(0, f"chunks read {self._n}")

    def docs(self, n: int) -> None:
        self._p.update(n)

    def close(self) -> None:
        self._p.close()
