"""The read-write loop (paper: "The workflow"): each chunk is one independent call that
overwrites a fixed-size memory; a last call answers from the question and the final memory.
`MemoryAgent` is the workflow "memagent" (memagent.agent.registry), the default of every command; the
protocol every workflow follows, its inputs and results and the run helpers are memagent.agent.protocol
(`AgentInput`, `AgentResult`, `Conversation`, `BudgetError` are re-exported here, where they always were).

Many documents run at once, each a small state machine driven by memagent.agent.scheduler: on an
in-process backend the ready prompts of all documents in flight form one batch (memory prompts in one,
final prompts in another); on a concurrent (HTTP) backend each document's next call goes out as soon
as its previous reply is in. A finished document frees its place for the next one at once. Per call
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence, TextIO

from memagent.agent.answer import final_answer, strip_think
from memagent.agent.chunking import Chunk, iter_chunks, middle_truncate
from memagent.agent.prompts import render
from memagent.agent.protocol import (AgentInput, AgentResult, BudgetError, Conversation, WorkflowOptions,
                                     check_questions, run_workflow, stream_workflow)
from memagent.agent.scheduler import Call, RunStats, call_seed, resolve_schedule  # noqa: F401  (call_seed: re-exported)
from memagent.agent.trace import draft_fields
from memagent.backends.base import Backend, BackendError, Generation, SamplingParams
from memagent.config import PLACEHOLDER, AgentConfig

log = logging.getLogger(__name__)


@dataclass
class DocState:
    """One document being read by `MemoryAgent`: its chunks still to come, the memory so far, its calls."""

    pos: int
    item: AgentInput
    chunks: Iterator[Chunk]
    next_chunk: Chunk | None
    memory: str
    step: int = 0
    conversations: list[Conversation] = field(default_factory=list)
    memory_tokens: int | None = None  # of `memory`, once a memory step has counted them
    calls: int = 0  # model calls made for this document (its k-th call is seeded by k in a pipelined run)
    seed_key: int | None = None  # AgentInput.seed_key


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


def template_overhead(backend: Backend, template: str) -> int:
    """The tokens a prompt of `template` has besides its fields, as a bound for filled fields: the backend's
    prompt length of the empty render, plus what its text pieces (between placeholders) count one by one
    over the empty render. A tokenizer may merge the pieces of an empty render ("<problem>\\n" + "\\n</problem>"
    -> one "\\n\\n" token) that filled fields keep apart, so the empty render alone can undercount."""
    tok = backend.tokenizer
    empty = PLACEHOLDER.sub("", template)
    n_empty = len(tok(empty, add_special_tokens=False)["input_ids"])
    pieces = [p for p in PLACEHOLDER.split(template)[::2] if p]  # split keeps the field names at odd places
    n_pieces = sum(len(ids) for ids in tok(pieces, add_special_tokens=False)["input_ids"]) if pieces else 0
    return backend.prompt_length(empty) + max(0, n_pieces - n_empty)


class MemoryAgent:
    """Answer questions over documents of any length with a fixed-size, overwritten memory: the workflow
    "memagent" (memagent.agent.registry), the default. Its keyword options are the shared run options
    (memagent.agent.protocol.WorkflowOptions: keep_conversations, on_step, trace_chunks, schedule, failures, ...).
    """

    name = "memagent"

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
        schedule: str = "auto",
        failures: str = "raise",
    ) -> None:
        self.backend = backend
        self.config = config or AgentConfig()
        self.options = WorkflowOptions(trace_path, progress, errors, keep_conversations, on_step, trace_chunks,
                                       schedule, failures)
        self.stats = RunStats()  # of the last run
        self._window_checked: AgentConfig | None = None  # the config whose window check passed
        resolve_schedule(schedule, backend)

    @property
    def schedule(self) -> str:
        return self.options.schedule

    @property
    def failures(self) -> str:
        return self.options.failures

    # -- checks before any model call -----------------------------------------------------
    def check_budget(self, items: Sequence[AgentInput]) -> None:
        """Raise BudgetError for a question over its budget or a window that cannot hold a call."""
        check_questions(self.backend, self.config, items)
        if self._window_checked is not self.config:  # once per config (a stream checks each document)
            self._check_window()
            self._window_checked = self.config

    def _check_window(self) -> None:
        cfg, window = self.config, self.backend.max_window
        if window is None:
            return
        mem_overhead = template_overhead(self.backend, cfg.memory_template)  # an upper bound: see its docstring
        fin_overhead = template_overhead(self.backend, cfg.final_template)
        need_mem = mem_overhead + cfg.query_tokens + cfg.chunk_tokens + 2 * cfg.memory_tokens
        need_fin = fin_overhead + cfg.query_tokens + cfg.memory_tokens + cfg.answer_tokens
        need = max(need_mem, need_fin)
        if need > window:
            raise BudgetError(
                f"a call needs up to {need} tokens (template {mem_overhead} + query {cfg.query_tokens} + "
                f"chunk {cfg.chunk_tokens} + memory {cfg.memory_tokens} + output {max(cfg.memory_tokens, cfg.answer_tokens)}) "
                f"but the model's window is {window}; lower --chunk-tokens or --memory-tokens"
            )

    # -- the loop (memagent.agent.protocol) -------------------------------------------------
    def run(self, items: Sequence[AgentInput],
            on_result: Callable[[AgentResult], None] | None = None) -> list[AgentResult]:
        """`run_workflow(self, items, on_result)`: every pair, results in input order; `self.stats` after."""
        return run_workflow(self, items, on_result)

    def stream(self, items: Iterable[AgentInput], on_result: Callable[[AgentResult], None],
               total: int | None = None) -> RunStats:
        """`stream_workflow(self, items, on_result, total)`: results as documents finish, none kept."""
        return stream_workflow(self, items, on_result, total)

    # -- the steps of one document (memagent.agent.scheduler.Steps) -------------------------
    def start(self, pos: int, item: AgentInput) -> DocState:
        document = item.document
        if self.config.document_tokens is not None:
            document = middle_truncate(document, self.backend.tokenizer, self.config.document_tokens).context
        chunks = iter_chunks(document, self.backend.tokenizer, self.config.chunk_tokens, errors=self.options.errors)
        first = next(chunks, None)
        while first is not None and first.start_token < item.start_token:  # resuming: skip the chunks read
            first = next(chunks, None)
        if first is None and item.start_token == 0:
            log.warning("document %s is empty: answering from an empty memory", item.doc_id)
        return DocState(pos, item, chunks, first, self.config.empty_memory if item.memory is None else item.memory,
                    step=item.start_step, seed_key=item.seed_key)

    def next_call(self, d: DocState) -> Call:
        """The document's next call: a memory update while chunks are left, then the final answer."""
        cfg = self.config
        if d.next_chunk is not None:
            prompt = render(cfg.memory_template, question=d.item.question, memory=d.memory, chunk=d.next_chunk.text)
            return Call("memory", prompt, cfg.memory_tokens)
        return Call("final", render(cfg.final_template, question=d.item.question, memory=d.memory), cfg.answer_tokens)

    def params(self, max_new_tokens: int, seed: int | None) -> SamplingParams:
        return SamplingParams(max_new_tokens, self.config.temperature, self.config.top_p, seed)

    def take(self, d: DocState, call: Call, gen: Generation, seconds: float, batch_size: int) -> AgentResult | None:
        if call.kind == "memory":
            self._take_memory(d, call.prompt, gen, seconds, batch_size)
            return None
        return self._take_final(d, call.prompt, gen, seconds, batch_size)

    def fail(self, d: Any, exc: BaseException) -> AgentResult:
        """The result of a document whose call failed: no answer, and `error` {kind, message, attempts}."""
        attempts = 1
        if isinstance(exc, BackendError):  # the tries the request made (replicas: more; a 4xx: one), else the most
            attempts = getattr(exc, "attempts", None) or 1 + int(getattr(self.backend, "max_retries", 0) or 0)
        log.warning("document %s failed: %s", d.item.doc_id, exc)
        if not isinstance(d, DocState):  # failed before its first chunk was read
            return AgentResult(d.item.doc_id, d.item.question, None, "", "", 0, error=_error(exc, 1))
        return AgentResult(d.item.doc_id, d.item.question, None, "", d.memory, d.step, d.conversations,
                           error=_error(exc, attempts), calls=d.calls)

    def _take_memory(self, d: DocState, prompt: str, gen: Generation, seconds: float, batch_size: int) -> None:
        cfg, tok = self.config, self.backend.tokenizer
        text, think_removed = strip_think(gen.text) if cfg.think == "strip" else (gen.text, False)
        memory, n_mem, truncated = cap_tokens_many([text.strip()], tok, cfg.memory_tokens)[0]
        truncated = truncated or gen.finish_reason == "length"  # stopped at M tokens: cut mid-sentence, not ended
        chunk = d.next_chunk
        if truncated:
            log.info("document %s step %d: memory cut to %d tokens", d.item.doc_id, d.step, cfg.memory_tokens)
        if self.options.observed:
            n_prompt = len(gen.prompt_token_ids) if gen.prompt_token_ids is not None else self.backend.prompt_length(prompt)
            self.options.emit(dict(doc_id=d.item.doc_id, step=d.step, chunk_start=chunk.start_token,
                            chunk_tokens=len(chunk.token_ids), prompt_tokens=n_prompt, memory_tokens=n_mem,
                            memory=memory, truncated=truncated, think_removed=think_removed,
                            seconds=round(seconds, 6), batch_size=batch_size, **draft_fields(gen)), chunk.text)
        if self.options.keep_conversations:
            d.conversations.append(Conversation("memory", d.step, prompt, gen.prompt_token_ids,
                                                gen.token_ids, gen.logprobs, memory, truncated))
        d.memory, d.memory_tokens = memory, n_mem
        d.step += 1
        d.next_chunk = next(d.chunks, None)

    def _take_final(self, d: DocState, prompt: str, gen: Generation, seconds: float, batch_size: int) -> AgentResult:
        cfg = self.config
        answer, think_removed = final_answer(gen.text, cfg.answer_protocol, cfg.think)
        if self.options.observed:
            n_prompt = len(gen.prompt_token_ids) if gen.prompt_token_ids is not None else self.backend.prompt_length(prompt)
            n_mem = d.memory_tokens if d.memory_tokens is not None else \
                len(self.backend.tokenizer(d.memory, add_special_tokens=False)["input_ids"])
            self.options.emit(dict(doc_id=d.item.doc_id, step=d.step, kind="final", prompt_tokens=n_prompt,
                            memory_tokens=n_mem, answer=answer, raw_answer=gen.text, think_removed=think_removed,
                            seconds=round(seconds, 6), batch_size=batch_size, **draft_fields(gen)))
        if self.options.keep_conversations:
            d.conversations.append(Conversation("final", d.step, prompt, gen.prompt_token_ids,
                                                gen.token_ids, gen.logprobs, gen.text))
        return AgentResult(d.item.doc_id, d.item.question, answer, gen.text, d.memory, d.step,
                           d.conversations, think_removed, calls=d.calls)


def _error(exc: BaseException, attempts: int) -> dict[str, Any]:
    return dict(kind=type(exc).__name__, message=str(exc), attempts=attempts)
