"""The `lookup` workflow: read with an overwritten memory as the paper does, and look back into the text.

The overwrite loop loses early evidence for good: a fact read before the agent knows it matters is gone
once the memory is rewritten (docs/paper.md, "Limits we build beyond"). `lookup` keeps the text in an
on-disk full-text index (memagent.documents.index) and lets the model search it at the end:

1. as the document streams, each chunk is read with the memory exactly as in `memagent` (same prompt, same
   M-token cap) and is written to the index with its token offsets;
2. after the last chunk, the model writes a search query from the question and its memory (a conversation
   of kind "query", prompts.LOOKUP_QUERY_TEMPLATE);
3. the top `hits` chunks for that query (BM25; chunks already looked back at are left out) are read with the
   memory as ordinary memory updates: their conversations are "memory" ones with `step` = the chunk's number,
   and the query's trace record lists each hit's offsets [start, end) (the evidence);
4. steps 2-3 repeat `lookups` times, then the final answer as in `memagent`.

Calls per document: K + lookups * (1 + hits) + 1 at most (fewer where a query finds fewer chunks).
The reading, the memory cap and the answer are memagent's own (`read` and `answer` of memagent.agent.workflow,
with `yield from`); what is new is the index, the query call and the order of the steps. Each document has its own index, closed (and removed
unless keep_index) when the document finishes or fails.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from memagent.agent.answer import strip_think
from memagent.agent.chunking import Chunk
from memagent.documents.index import ChunkIndex, Hit
from memagent.prompts import LOOKUP_QUERY_TEMPLATE, render
from memagent.agent.protocol import Call, Document, Prompt, paper_window, workflow
from memagent.agent.workflow import Reading, answer, read
from memagent.config import AgentConfig, ConfigError, check_template

MAX_LOOKUPS = 4  # rounds of query + hits; each costs 1 + hits calls
MAX_HITS = 8  # chunks read per lookup
MAX_LOOKUP_TOKENS = 256  # new tokens of a query reply: a query is a few keywords
QUERY_FIELDS = ("question", "memory")  # the placeholders of a query template


def bounded_int(workflow: str, name: str, value: Any, low: int, high: int) -> int:
    """`value` as an int in [low, high] (a string of digits, as a command line gives it, is read); else a
    ConfigError that says the range."""
    if isinstance(value, str) and re.fullmatch(r"[0-9]+", value.strip()):  # ASCII digits ("²" is a digit too)
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigError(f"workflow {workflow}: {name} must be an integer from {low} to {high}, got {value!r}")
    return value


def index_name(pos: int, doc_id: str) -> str:
    """The index file of a document in a run folder: its input position and id (made a safe file name)."""
    return f"{pos:06d}-{re.sub(r'[^A-Za-z0-9._-]+', '_', doc_id)[:64]}.sqlite"


def hit_record(h: Hit) -> dict[str, Any]:
    """A hit as the trace records it: chunk number, token offsets [start, end), BM25 score."""
    return dict(chunk=h.chunk_no, start=h.start_token, end=h.end_token, score=round(h.score, 6))


@dataclass
class LookupOptions:
    """The options of `lookup` (the rest are the shared run options, memagent.agent.protocol.WorkflowOptions)."""

    lookups: int = 1  # rounds of query + hits, 1..4
    hits: int = 2  # chunks read per lookup, 1..8
    lookup_tokens: int = 32  # new tokens of a query reply, 1..256 (counted in the window check)
    query_template: str = LOOKUP_QUERY_TEMPLATE  # the query call's prompt, with {question} and {memory}
    index_dir: str | Path | None = None  # a folder for the index files (e.g. the run's); None: a temporary one
    keep_index: bool = False  # leave the index files on close

    def __post_init__(self) -> None:
        self.lookups = bounded_int("lookup", "lookups", self.lookups, 1, MAX_LOOKUPS)
        self.hits = bounded_int("lookup", "hits", self.hits, 1, MAX_HITS)
        self.lookup_tokens = bounded_int("lookup", "lookup_tokens", self.lookup_tokens, 1, MAX_LOOKUP_TOKENS)
        if not isinstance(self.query_template, str):
            raise ConfigError(f"workflow lookup: query_template must be a string, got "
                              f"{type(self.query_template).__name__}")
        check_template(self.query_template, QUERY_FIELDS, "lookup query")
        self.keep_index = bool(self.keep_index)


def lookup_window(config: AgentConfig, o: LookupOptions) -> list[Prompt]:
    """The paper's two calls (hits are chunks: their calls fit as the chunks' did) and the query call."""
    return [*paper_window(config), Prompt(o.query_template, dict(query=config.query_tokens, memory=config.memory_tokens,
                                                                 output=o.lookup_tokens),
                                          "the lookup query call", "lower --memory-tokens or lookup_tokens")]


@workflow(options=LookupOptions, window=lookup_window)
def lookup(doc: Document, question: str, o: LookupOptions) -> Reading:
    """Read every chunk into the memory and the index; `lookups` times, ask the model for a query and read its
    top `hits` chunks again; then answer."""
    with ChunkIndex(o.index_dir, name=index_name(doc.pos, doc.id), keep=o.keep_index) as index:
        memory = yield from read(doc, question, _indexed(doc.chunks(), index), doc.memory)
        k, looked_at = doc.num_chunks, set()
        for n in range(1, o.lookups + 1):
            if not len(index):  # an empty document: nothing to look back at
                break
            reply = yield Call("query", render(o.query_template, question=question, memory=memory), o.lookup_tokens,
                               step=k)
            query = strip_think(reply.text)[0] if doc.config.think == "strip" else reply.text
            query = query.strip().encode("utf-8", "replace").decode("utf-8")  # a lone surrogate -> "?"
            found = index.search(query, o.hits, exclude=looked_at)
            looked_at.update(h.chunk_no for h in found)
            reply.keep(query, lookup=n, query=query, hits=[hit_record(h) for h in found],
                       generated_tokens=len(reply.gen.token_ids))
            memory = yield from read(doc, question, [h.chunk() for h in found], memory)
        return (yield from answer(doc, question, memory, k))


def _indexed(chunks: Iterable[Chunk], index: ChunkIndex) -> Iterator[Chunk]:
    """`chunks`, each written to `index` as it is read (searchable from then on)."""
    for chunk in chunks:
        index.add(chunk)
        yield chunk
