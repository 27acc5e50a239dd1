"""The `lookup` workflow: read with an overwritten memory as the paper does, and look back into the text.

The overwrite loop loses early evidence for good: a fact read before the agent knows it matters is gone
once the memory is rewritten (docs/paper.md, "Limits we build beyond"). `lookup` keeps the text in an
on-disk full-text index (memagent.agent.index) and lets the model search it at the end:

1. as the document streams, each chunk is read with the memory exactly as in `memagent` (same prompt, same
   M-token cap) and is written to the index with its token offsets;
2. after the last chunk, the model writes a search query from the question and its memory (a conversation
   of kind "query", prompts.LOOKUP_QUERY_TEMPLATE);
3. the top `hits` chunks for that query (BM25; chunks already looked back at are left out) are read with the
   memory as ordinary memory updates: their conversations are "memory" ones with `step` = the chunk's number,
   and the query's trace record lists each hit's offsets [start, end) (the evidence);
4. steps 2-3 repeat `lookups` times, then the final answer as in `memagent`.

Calls per document: K + lookups * (1 + hits) + 1 at most (fewer where a query finds fewer chunks).
The reading, the memory cap and the answer are MemoryAgent's own (this module composes it); what is new is
the index, the query call and the order of the steps. Each document has its own index, closed (and removed
unless keep_index) when the document finishes or fails.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from memagent.agent.answer import strip_think
from memagent.agent.index import ChunkIndex, Hit
from memagent.agent.prompts import LOOKUP_QUERY_TEMPLATE, render
from memagent.agent.protocol import (AgentInput, AgentResult, BudgetError, Conversation, RunStats, run_workflow,
                                     split_options, stream_workflow)
from memagent.agent.scheduler import Call
from memagent.agent.workflow import DocState, MemoryAgent, template_overhead
from memagent.backends.base import Backend, Generation, SamplingParams
from memagent.config import AgentConfig, ConfigError, check_template

MAX_LOOKUPS = 4  # rounds of query + hits; each costs 1 + hits calls
MAX_HITS = 8  # chunks read per lookup
MAX_LOOKUP_TOKENS = 256  # new tokens of a query reply: a query is a few keywords
QUERY_FIELDS = ("question", "memory")  # the placeholders of a query template


def bounded_int(workflow: str, name: str, value: Any, low: int, high: int) -> int:
    """`value` as an int in [low, high] (a string of digits, as a command line gives it, is read); else a
    ConfigError that says the range."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigError(f"workflow {workflow}: {name} must be an integer from {low} to {high}, got {value!r}")
    return value


def own_options(workflow: str, options: dict[str, Any], valid: Sequence[str]) -> None:
    """ConfigError for an option the workflow does not have (the shared run options are taken out before)."""
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ConfigError(f"workflow {workflow} has no option {', '.join(unknown)}; its options are "
                          f"{', '.join(valid)} (and the shared run options)")


def index_name(pos: int, doc_id: str) -> str:
    """The index file of a document in a run folder: its input position and id (made a safe file name)."""
    return f"{pos:06d}-{re.sub(r'[^A-Za-z0-9._-]+', '_', doc_id)[:64]}.sqlite"


def hit_record(h: Hit) -> dict[str, Any]:
    """A hit as the trace records it: chunk number, token offsets [start, end), BM25 score."""
    return dict(chunk=h.chunk_no, start=h.start_token, end=h.end_token, score=round(h.score, 6))


@dataclass
class _LookupDoc:
    """One document's state: the inner MemoryAgent state (memory, chunks, conversations), its index, and the
    lookup rounds done."""

    pos: int
    inner: DocState  # MemoryAgent's state; its next_chunk is the next chunk of the document or the next hit
    index: ChunkIndex
    calls: int = 0  # model calls made (the scheduler counts them)
    seed_key: int | None = None
    num_chunks: int = 0  # chunks of the document read (K), once the first pass is over
    lookups_done: int = 0
    looked_at: set[int] = field(default_factory=set)  # chunk numbers read again by a lookup
    looking_back: bool = False  # the first pass is over: memory calls now read hits

    @property
    def item(self) -> AgentInput:
        return self.inner.item


class LookupAgent:
    """The workflow "lookup" (module doc). Own options: lookups (1..4, default 1), hits (1..8, default 2),
    lookup_tokens (new tokens of a query, 1..256, default 32), query_template (the query call's prompt, with
    {question} and {memory}; default prompts.LOOKUP_QUERY_TEMPLATE), index_dir (a folder for the index files,
    e.g. the run's; None: a temporary folder per document), keep_index (leave the files). The rest are the
    shared run options (memagent.agent.protocol.WorkflowOptions)."""

    name = "lookup"
    OPTIONS = ("lookups", "hits", "lookup_tokens", "query_template", "index_dir", "keep_index")

    def __init__(self, backend: Backend, config: AgentConfig | None = None, *, lookups: int = 1, hits: int = 2,
                 lookup_tokens: int = 32, query_template: str = LOOKUP_QUERY_TEMPLATE,
                 index_dir: str | Path | None = None, keep_index: bool = False, **run_options: Any) -> None:
        self.reader = MemoryAgent(backend, config, **run_options)  # reads chunks and hits, answers
        self.backend, self.config, self.options = backend, self.reader.config, self.reader.options
        self.lookups = bounded_int(self.name, "lookups", lookups, 1, MAX_LOOKUPS)
        self.hits = bounded_int(self.name, "hits", hits, 1, MAX_HITS)
        self.lookup_tokens = bounded_int(self.name, "lookup_tokens", lookup_tokens, 1, MAX_LOOKUP_TOKENS)
        if not isinstance(query_template, str):
            raise ConfigError(f"workflow lookup: query_template must be a string, got {type(query_template).__name__}")
        check_template(query_template, QUERY_FIELDS, "lookup query")
        self.query_template = query_template
        self.index_dir, self.keep_index = index_dir, bool(keep_index)
        self.stats = RunStats()
        self._window_checked: AgentConfig | None = None

    # -- checks before any model call -----------------------------------------------------
    def check_budget(self, items: Sequence[AgentInput]) -> None:
        """MemoryAgent's checks (hits are chunks: their calls fit as the chunks' did) and the query call's."""
        self.reader.check_budget(items)
        if self._window_checked is self.config:
            return
        cfg, window = self.config, self.backend.max_window
        if window is not None:
            overhead = template_overhead(self.backend, self.query_template)
            need = overhead + cfg.query_tokens + cfg.memory_tokens + self.lookup_tokens
            if need > window:
                raise BudgetError(f"the lookup query call needs up to {need} tokens (template {overhead} + query "
                                  f"{cfg.query_tokens} + memory {cfg.memory_tokens} + output {self.lookup_tokens}) "
                                  f"but the model's window is {window}; lower --memory-tokens or lookup_tokens")
        self._window_checked = self.config

    # -- runs (memagent.agent.protocol) ------------------------------------------------------
    def run(self, items: Sequence[AgentInput],
            on_result: Callable[[AgentResult], None] | None = None) -> list[AgentResult]:
        return run_workflow(self, items, on_result)

    def stream(self, items: Iterable[AgentInput], on_result: Callable[[AgentResult], None],
               total: int | None = None) -> RunStats:
        return stream_workflow(self, items, on_result, total)

    # -- the steps of one document -------------------------------------------------------------
    def start(self, pos: int, item: AgentInput) -> _LookupDoc:
        inner = self.reader.start(pos, item)
        index = ChunkIndex(self.index_dir, name=index_name(pos, item.doc_id), keep=self.keep_index)
        return _LookupDoc(pos, inner, index, seed_key=item.seed_key)

    def next_call(self, d: _LookupDoc) -> Call:
        """A memory update while a chunk (first pass) or a hit is next; a query while lookups are left; the
        final answer."""
        if d.inner.next_chunk is None and d.lookups_done < self.lookups and len(d.index):
            prompt = render(self.query_template, question=d.item.question, memory=d.inner.memory)
            return Call("query", prompt, self.lookup_tokens)
        return self.reader.next_call(d.inner)

    def params(self, max_new_tokens: int, seed: int | None) -> SamplingParams:
        return self.reader.params(max_new_tokens, seed)

    def take(self, d: _LookupDoc, call: Call, gen: Generation, seconds: float, batch_size: int) -> AgentResult | None:
        d.inner.calls = d.calls
        if call.kind == "query":
            self._take_query(d, call, gen, seconds, batch_size)
            return None
        if call.kind == "memory":
            chunk = d.inner.next_chunk
            if d.looking_back:
                d.inner.step = chunk.index  # a hit's conversation and record carry its own chunk number
            else:
                d.index.add(chunk)  # read now, searchable from now on
            self.reader.take(d.inner, call, gen, seconds, batch_size)
            if d.looking_back:
                d.inner.step = d.num_chunks
            if d.inner.next_chunk is None and not d.looking_back:  # the first pass is over
                d.num_chunks, d.looking_back = d.inner.step, True
            return None
        if not d.looking_back:  # an empty document: no chunk, no lookup
            d.num_chunks = d.inner.step
        try:
            return self.reader.take(d.inner, call, gen, seconds, batch_size)
        finally:
            d.index.close()

    def fail(self, d: Any, exc: BaseException) -> AgentResult:
        if isinstance(d, _LookupDoc):
            d.index.close()
            d.inner.calls = d.calls
            return self.reader.fail(d.inner, exc)
        return self.reader.fail(d, exc)

    def _take_query(self, d: _LookupDoc, call: Call, gen: Generation, seconds: float, batch_size: int) -> None:
        """Search the index for the model's query; the hits become the next chunks to read."""
        query, _ = strip_think(gen.text) if self.config.think == "strip" else (gen.text, False)
        query = query.strip().encode("utf-8", "replace").decode("utf-8")  # a lone surrogate (JSON "\\ud800") -> "?"
        found = d.index.search(query, self.hits, exclude=d.looked_at)
        d.lookups_done += 1
        d.looked_at.update(h.chunk_no for h in found)
        d.looking_back = True
        if self.options.observed:
            n_prompt = len(gen.prompt_token_ids) if gen.prompt_token_ids is not None else \
                self.backend.prompt_length(call.prompt)
            self.options.emit(dict(doc_id=d.item.doc_id, step=d.num_chunks, kind="query", lookup=d.lookups_done,
                                   query=query, hits=[hit_record(h) for h in found], prompt_tokens=n_prompt,
                                   generated_tokens=len(gen.token_ids),
                                   seconds=round(seconds, 6), batch_size=batch_size))
        if self.options.keep_conversations:
            d.inner.conversations.append(Conversation("query", d.num_chunks, call.prompt, gen.prompt_token_ids,
                                                      gen.token_ids, gen.logprobs, query))
        chunks = [h.chunk() for h in found]  # at most MAX_HITS chunks of C tokens
        d.inner.next_chunk = chunks[0] if chunks else None
        d.inner.chunks = iter(chunks[1:])


def build(backend: Backend, config: AgentConfig | None = None, **options: Any) -> LookupAgent:
    """The registry's factory (memagent.agent.registry): shared run options plus lookup's own (LookupAgent)."""
    own_options(LookupAgent.name, split_options(options)[1], LookupAgent.OPTIONS)
    return LookupAgent(backend, config, **options)
