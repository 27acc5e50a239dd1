"""The `skim` workflow: retrieve, then read. Reading is serial, so the overwrite loop's latency grows with the
number of chunks K (docs/paper.md, "Limits we build beyond"); skim reads only the k chunks most like the question.

1. a first pass, without model calls, writes every chunk to an on-disk full-text index (memagent.agent.index)
   as the document streams; the chunks' text is kept there, so the source is read once (a stream works);
2. the chunks are ranked against the question (BM25); the top k are kept, and when fewer than k share a word
   with the question the earliest other chunks fill the rest, so a document of K >= k chunks always gets k;
3. the memory loop (MemoryAgent's own prompt, M-token cap and answer) reads those k in document order, each
   memory conversation's `step` being the chunk's number, then answers: min(k, K) + 1 calls instead of K + 1.

With k >= K it reads every chunk in order: the calls and answers of `memagent`. It fails where the question
shares no word with the evidence (a paraphrase, a second hop named only in another chunk): the ranking cannot
see what the memory would have learnt. The trace has one record per model call, as every workflow's: each
chosen chunk's memory record carries its `chunk_start` (the evidence); the ranking itself is no call and has no
record (`_SkimDoc.chosen` holds it).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from memagent.agent.index import ChunkIndex
from memagent.agent.lookup import bounded_int, index_name, own_options
from memagent.agent.protocol import AgentInput, AgentResult, RunStats, run_workflow, split_options, stream_workflow
from memagent.agent.scheduler import Call
from memagent.agent.workflow import DocState, MemoryAgent
from memagent.backends.base import Backend, Generation, SamplingParams
from memagent.config import AgentConfig

MAX_K = 64  # chunks read at most; skim is for reading few


@dataclass
class _SkimDoc:
    """One document's state: the inner MemoryAgent state, whose chunks are now the chosen ones, and the index."""

    pos: int
    inner: DocState
    index: ChunkIndex
    num_chunks: int  # K: chunks of the document (all indexed)
    chosen: tuple[int, ...]  # chunk numbers to read, in document order
    calls: int = 0
    seed_key: int | None = None

    @property
    def item(self) -> AgentInput:
        return self.inner.item


class SkimAgent:
    """The workflow "skim" (module doc). Own options: k (chunks read, 1..64, default 4), index_dir (a folder
    for the index files; None: a temporary folder per document), keep_index. The rest are the shared run
    options (memagent.agent.protocol.WorkflowOptions)."""

    name = "skim"
    OPTIONS = ("k", "index_dir", "keep_index")

    def __init__(self, backend: Backend, config: AgentConfig | None = None, *, k: int = 4,
                 index_dir: str | Path | None = None, keep_index: bool = False, **run_options: Any) -> None:
        self.reader = MemoryAgent(backend, config, **run_options)
        self.backend, self.config, self.options = backend, self.reader.config, self.reader.options
        self.k = bounded_int(self.name, "k", k, 1, MAX_K)
        self.index_dir, self.keep_index = index_dir, bool(keep_index)
        self.stats = RunStats()

    def check_budget(self, items: Sequence[AgentInput]) -> None:
        """MemoryAgent's checks: skim makes only its calls (memory updates of whole chunks, the final)."""
        self.reader.check_budget(items)

    def run(self, items: Sequence[AgentInput],
            on_result: Callable[[AgentResult], None] | None = None) -> list[AgentResult]:
        return run_workflow(self, items, on_result)

    def stream(self, items: Iterable[AgentInput], on_result: Callable[[AgentResult], None],
               total: int | None = None) -> RunStats:
        return stream_workflow(self, items, on_result, total)

    # -- the steps of one document -------------------------------------------------------------
    def start(self, pos: int, item: AgentInput) -> _SkimDoc:
        """The first pass (no model call): index every chunk, choose the k to read."""
        inner = self.reader.start(pos, item)
        index = ChunkIndex(self.index_dir, name=index_name(pos, item.doc_id), keep=self.keep_index)
        try:
            if inner.next_chunk is not None:
                index.add(inner.next_chunk)
            index.add_all(inner.chunks)
            hits = index.search(item.question, self.k)
            chosen = sorted(h.chunk_no for h in hits)
            chosen = sorted(chosen + index.first(self.k - len(chosen), exclude=chosen))
        except BaseException:
            index.close()
            raise
        d = _SkimDoc(pos, inner, index, inner.step + len(index), tuple(chosen), seed_key=item.seed_key)
        inner.chunks = _chunks(index, chosen[1:])
        inner.next_chunk = index.get(chosen[0]).chunk() if chosen else None
        return d

    def next_call(self, d: _SkimDoc) -> Call:
        return self.reader.next_call(d.inner)

    def params(self, max_new_tokens: int, seed: int | None) -> SamplingParams:
        return self.reader.params(max_new_tokens, seed)

    def take(self, d: _SkimDoc, call: Call, gen: Generation, seconds: float, batch_size: int) -> AgentResult | None:
        d.inner.calls = d.calls
        if call.kind == "memory":
            d.inner.step = d.inner.next_chunk.index  # the conversation and record carry the chunk's own number
            self.reader.take(d.inner, call, gen, seconds, batch_size)
            if d.inner.next_chunk is None:
                d.inner.step = d.num_chunks  # the final call's step and the result's num_chunks: K
            return None
        d.inner.step = d.num_chunks
        try:
            return self.reader.take(d.inner, call, gen, seconds, batch_size)
        finally:
            d.index.close()

    def fail(self, d: Any, exc: BaseException) -> AgentResult:
        if isinstance(d, _SkimDoc):
            d.index.close()
            d.inner.calls = d.calls
            return self.reader.fail(d.inner, exc)
        return self.reader.fail(d, exc)


def _chunks(index: ChunkIndex, numbers: Sequence[int]) -> Iterator[Any]:
    """The chunks numbered `numbers`, read from the index one at a time (the source is not read again)."""
    for no in numbers:
        yield index.get(no).chunk()


def build(backend: Backend, config: AgentConfig | None = None, **options: Any) -> SkimAgent:
    """The registry's factory (memagent.agent.registry): shared run options plus skim's own (SkimAgent)."""
    own_options(SkimAgent.name, split_options(options)[1], SkimAgent.OPTIONS)
    return SkimAgent(backend, config, **options)
