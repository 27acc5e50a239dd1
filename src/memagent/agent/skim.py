"""The `skim` workflow: retrieve, then read. Reading is serial, so the overwrite loop's latency grows with the
number of chunks K (docs/paper.md, "Limits we build beyond"); skim reads only the k chunks most like the question.

1. a first pass, without model calls, writes every chunk to an on-disk full-text index (memagent.documents.index)
   as the document streams; the chunks' text is kept there, so the source is read once (a stream works);
2. the chunks are ranked against the question (BM25); the top k are kept, and when fewer than k share a word
   with the question the earliest other chunks fill the rest, so a document of K >= k chunks always gets k;
3. the memory loop (memagent's own `read` and `answer`, with `yield from`) reads those k in document order, each
   memory conversation's `step` being the chunk's number, then answers: min(k, K) + 1 calls instead of K + 1.

With k >= K it reads every chunk in order: the calls and answers of `memagent`. It fails where the question
shares no word with the evidence (a paraphrase, a second hop named only in another chunk): the ranking cannot
see what the memory would have learnt. The trace has one record per model call, as every workflow's: each
chosen chunk's memory record carries its `chunk_start` (the evidence); the ranking itself is no call and has no
record.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from memagent.documents.index import ChunkIndex
from memagent.agent.lookup import bounded_int, index_name
from memagent.agent.protocol import Document, workflow
from memagent.agent.workflow import Reading, answer, read

MAX_K = 64  # chunks read at most; skim is for reading few


@dataclass
class SkimOptions:
    """The options of `skim` (the rest are the shared run options, memagent.agent.protocol.WorkflowOptions)."""

    k: int = 4  # chunks read, 1..64
    index_dir: str | Path | None = None  # a folder for the index files; None: a temporary one per document
    keep_index: bool = False  # leave the index files on close

    def __post_init__(self) -> None:
        self.k = bounded_int("skim", "k", self.k, 1, MAX_K)
        self.keep_index = bool(self.keep_index)


@workflow(options=SkimOptions)  # its calls are the paper's two kinds: the paper's window
def skim(doc: Document, question: str, o: SkimOptions) -> Reading:
    """Index every chunk (no model call), read the k most like the question in document order, answer."""
    with ChunkIndex(o.index_dir, name=index_name(doc.pos, doc.id), keep=o.keep_index) as index:
        index.add_all(doc.chunks())
        chosen = sorted(h.chunk_no for h in index.search(question, o.k))
        chosen = sorted(chosen + index.first(o.k - len(chosen), exclude=chosen))
        memory = yield from read(doc, question, (index.get(n).chunk() for n in chosen), doc.memory)
        return (yield from answer(doc, question, memory, doc.num_chunks))
