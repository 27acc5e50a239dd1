"""Standing questions: a question registered on a stream keeps its own memory, advanced one memory update per
FULL chunk of the stream's text as events arrive; the partial tail is read only when an answer is asked.

The stream's text is its events rendered in order (memagent.streams.events). Its token ids are the concatenation
of each event's ids, tokenised on its own (each boundary checked: `event_ids`), and they are read in chunks of
C tokens exactly as `iter_chunks` cuts the whole text: chunk k is tokens [k*C, (k+1)*C). A full chunk never changes
once its last token has arrived, so its memory update is made once and kept (`memories`, one row per version).
The tokens after the last full chunk (fewer than C: the tail) wait in the question's row. An answer reads the tail
as one more memory update (not kept as a version: the next events will extend that chunk) and asks the final
call: at most two calls however long the history, once the question is current.

Equivalence (tests/streams/test_standing.py): after any sequence of appends, the memories and the answer of a
standing question are those of `memagent ask` over the stream's text with the same model, config and chunking:
the prompts are the same (the paper's loop, `memagent.agent.workflow.read` and `answer`, runs each call), and so
are the seeds: the k-th chunk's update is the run's call k + 1, as in a one-document `ask` run.

Crash safety: a memory version is written with the read state it belongs to (events read, tail ids) in one
transaction; a process killed during a model call loses that call only, and the next advance makes it again.
Two processes advancing one question: the second to commit finds the question moved and drops its version.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator

from memagent.agent.chunking import Chunk
from memagent.agent.protocol import AgentInput, Answer, Document
from memagent.agent.runner import Runner, run_workflow
from memagent.agent.workflow import answer as answer_call
from memagent.agent.workflow import read, workflow
from memagent.backends.base import SamplingParams
from memagent.config import AgentConfig
from memagent.streams.events import StreamError
from memagent.streams.store import StreamFile

BOUNDARY_CHARS = 256  # how much of the previous event the boundary check tokenises with the next one
TOKEN_CACHE = 4096  # events whose ids an open stream file keeps for its other questions
PROBE = "[2026-01-01T00:00:00Z] user (probe):\nThe quick brown fox, 1234 - jumps over Ünïcödé.\n"
_IGNORED = ("max_batch_docs",)  # config fields that do not change a question's reading


def config_data(config: AgentConfig) -> dict[str, Any]:
    """The fields of `config` that change what a standing question reads and writes."""
    return {k: v for k, v in asdict(config).items() if k not in _IGNORED}


def question_key(question: str, model: str, config: AgentConfig) -> str:
    """A standing question's identity: its text, the model's name and the reading config."""
    blob = json.dumps([question, model, config_data(config)], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def token_ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


_JOINS = ("this model's tokenizer joins tokens across the boundary between two events, so a standing question "
          "cannot read the stream chunk by chunk as `memagent ask` reads its text; ask ad hoc instead (memagent "
          "stream ask without --standing), or use a byte-level BPE tokenizer (GPT-2, Llama 3, Qwen, SmolLM2 kinds)")


def event_ids(file: StreamFile, tokenizer: Any, probe: str, event: Any, before: str) -> list[int]:
    """The token ids of `event` rendered, its boundary with the previous event (`before`: that one's last characters)
    checked; one batched tokenizer call, cached on the open file by (tokenizer, event), so the questions of one
    stream tokenise each event once."""
    key = (probe, event.id)
    cached = file.token_cache.get(key)
    if cached is not None:
        return cached
    text = event.render()
    if before:
        ids, alone, joint = (list(x) for x in tokenizer([text, before, before + text],
                                                        add_special_tokens=False)["input_ids"])
        if joint != alone + ids:
            raise StreamError(_JOINS)
    else:
        ids = token_ids(tokenizer, text)
    file.token_cache[key] = ids
    while len(file.token_cache) > TOKEN_CACHE:
        file.token_cache.popitem(last=False)
    return ids


@workflow(resumable=True)
def _advance(doc: Document, question: str, options: Any = None) -> Any:
    """Read the chunks handed in (`AgentInput.document`: a list of Chunk) into the memory; no answer."""
    chunks = doc.item.document
    memory = yield from read(doc, question, chunks, doc.memory)
    return Answer(None, "", memory, doc.item.start_step + len(chunks))


@workflow(resumable=True)
def _answer(doc: Document, question: str, options: Any = None) -> Any:
    """Read the chunks handed in (the tail: none or one), then the final call."""
    chunks = doc.item.document
    memory = yield from read(doc, question, chunks, doc.memory)
    return (yield from answer_call(doc, question, memory, doc.item.start_step + len(chunks)))


class _Offset(Runner):
    """A Runner whose k-th call is seeded as call `offset + k` of a one-document run (the seeds of `ask`)."""

    def __init__(self, wf: Any, backend: Any, config: AgentConfig, offset: int, **options: Any) -> None:
        super().__init__(wf, backend, config, **options)
        self.offset = offset

    def params(self, max_new_tokens: int, seed: int | None) -> SamplingParams:
        return super().params(max_new_tokens, None if seed is None else seed + self.offset)


@dataclass
class MemoryVersion:
    """One memory update of a standing question: after chunk `chunk` (0, 1, ...), which ends in event
    `events_read`; `record` is the call's trace record (as `memagent ask --trace` writes it)."""

    question_id: int
    chunk: int
    events_read: int
    memory: str
    record: dict[str, Any]


@dataclass
class StreamAnswer:
    """An answer over a stream: `answer` (None: the model wrote none), the reply, the memory it answered from,
    how much of the stream it read (`events`, `chunks`: full chunks plus the tail, if any) and the calls made."""

    question: str
    answer: str | None
    raw_answer: str
    memory: str
    events: int
    chunks: int
    calls: int
    question_id: int | None = None  # the standing question's id; None for an ad-hoc question


class StandingQuestion:
    """A standing question of a stream file, bound to a backend and the config it was registered with."""

    def __init__(self, file: StreamFile, qid: int, backend: Any, config: AgentConfig,
                 on_step: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.file, self.id, self.backend, self.config, self.on_step = file, qid, backend, config, on_step
        row = file.question_row("id", qid)
        if row is None:
            raise StreamError(f"{file.path} has no standing question {qid}")
        self.question = row["question"]
        if config.document_tokens is not None:
            raise StreamError("a standing question reads every chunk of the stream; it cannot cut the text in the "
                              "middle (document_tokens): leave it unset")
        self.probe = row["probe"]
        if self.probe != probe_of(backend.tokenizer):
            raise StreamError(f"standing question {qid} was registered with another tokenizer (model "
                              f"{row['model']!r}); give that model, or register the question again with this one")

    def state(self) -> dict[str, Any]:
        row = self.file.question_row("id", self.id)
        if row is None:
            raise StreamError(f"{self.file.path}: standing question {self.id} is gone")
        return row

    def advance(self) -> list[MemoryVersion]:
        """Read every full chunk of the events appended so far (one memory update each, each kept); the tokens
        after the last full chunk wait in the tail. The versions made, oldest first."""
        made: list[MemoryVersion] = []
        for version in self.iter_advance():
            made.append(version)
        return made

    def iter_advance(self) -> Iterator[MemoryVersion]:
        """`advance`, each version yielded as soon as it is saved."""
        tok, c = self.backend.tokenizer, self.config.chunk_tokens
        row = self.state()
        chunks, events_read, tail, last = row["chunks"], row["events_read"], row["tail"], row["last"]
        memory = row["memory"]
        saved_read = events_read
        for event in self.file.iter_events(after=events_read):
            ids = event_ids(self.file, tok, self.probe, event, last)
            tail, events_read, last = tail + ids, event.id, event.render()[-BOUNDARY_CHARS:]
            while len(tail) >= c:
                piece = tail[:c]  # (C,) token ids of chunk number `chunks`
                chunk = Chunk(chunks, tok.decode(piece), piece, chunks * c)
                result, records = self._run(_advance, [chunk], memory, chunks)
                memory, record = result.memory, _memory_record(records)
                if not self.file.save_progress(self.id, chunks, events_read, tail[c:], last, memory, record):
                    return  # another process read this chunk first: its version is the one kept
                yield MemoryVersion(self.id, chunks, events_read, memory, record)
                chunks, tail, saved_read = chunks + 1, tail[c:], events_read
        if events_read != saved_read:
            self.file.save_progress(self.id, chunks, events_read, tail, last)

    def answer(self) -> StreamAnswer:
        """Advance to the stream's end, then read the tail (if any) and answer: the tail read and the final call."""
        self.advance()
        row = self.state()
        tok, c, k = self.backend.tokenizer, self.config.chunk_tokens, row["chunks"]
        tail = row["tail"]  # (< C,) the tokens after the last full chunk
        chunks = [Chunk(k, tok.decode(tail), tail, k * c)] if tail else []
        result, _ = self._run(_answer, chunks, row["memory"], k)
        self.file.add_answer(self.id, row["events_read"], k + len(chunks), result.answer, result.raw_answer,
                             result.memory)
        return StreamAnswer(self.question, result.answer, result.raw_answer, result.memory, row["events_read"],
                            k + len(chunks), result.calls, self.id)

    def memories(self) -> list[dict[str, Any]]:
        return self.file.memories(self.id)

    def _run(self, wf: Any, chunks: list[Chunk], memory: str | None, done: int) -> tuple[Any, list[dict]]:
        """Run `wf` over `chunks` from `memory` (None: the empty memory) as calls `done + 1, ...` of the stream."""
        records: list[dict[str, Any]] = []

        def step(record: dict[str, Any]) -> None:
            records.append({k: v for k, v in record.items() if k != "chunk_text"})
            if self.on_step is not None:
                self.on_step(record)

        runner = _Offset(wf, self.backend, self.config, done, on_step=step, max_calls=len(chunks) + 1,
                         failures="raise")
        item = AgentInput(self.question, chunks, f"q{self.id}", memory=memory, start_step=done,
                          start_token=done * self.config.chunk_tokens)
        return run_workflow(runner, [item])[0], records


def _memory_record(records: list[dict[str, Any]]) -> dict[str, Any]:
    return next((r for r in reversed(records) if r.get("kind", "memory") == "memory"), {})


def probe_of(tokenizer: Any) -> str:
    """What identifies a tokenizer here: its ids of PROBE."""
    return json.dumps(token_ids(tokenizer, PROBE))


def register(file: StreamFile, question: str, model: str, config: AgentConfig, backend: Any) -> int:
    """The id of the standing question (question, model, config) of `file`, registered now if it is new (after the
    checks a run makes before any call: the question's budget, the model's window)."""
    key = question_key(question, model, config)
    row = file.question_row("key", key)
    if row is not None:
        return row["id"]
    if not isinstance(question, str) or not question.strip():
        raise StreamError("a standing question is empty; give its text")
    _Offset(_answer, backend, config, 0).check_budget([AgentInput(question, [], "new")])
    return file.add_question(question, model, config_data(config), key, probe_of(backend.tokenizer))
