"""The scheduler: how the documents of a run advance, many at once. Each is a small state machine (`Steps`: start,
next call, take the reply, fail); memagent.agent.runner makes one of each workflow generator
(memagent.agent.protocol) and records what the scheduler does not: conversations, trace records, results.

Two schedules:
- "lockstep" (in-process backends: transformers, the vLLM engine): the ready prompts of every document in
  flight form the next `generate` batches, one per call kind and output budget (memory prompts in one batch,
  final prompts in another, a workflow's other kinds in their own); a document that finishes frees its place
  for the next one at once. The `call`-th batch of a run under seed s is seeded `call_seed(s, call)`.
- "pipelined" (concurrent backends: HTTP): each document's next call goes out as soon as its previous reply
  is in, with at most `max_concurrency` requests and `max_batch_docs` documents in flight. The k-th call
  (1, 2, ...) of the document at input position p is seeded `doc_call_seed(s, p, k)`: timing never changes a
  seed, and a run of one document gets the seeds lock-step gives it.

Seed keys: a document given a `seed_key` (AgentInput.seed_key, e.g. a rollout's global identity) has its k-th
call seeded `keyed_call_seed(s, key, k)` under both schedules; in lock-step its batch then carries one seed per
prompt (`SamplingParams.seeds`), so on a backend that honours them its draws do not depend on the batch, its
input position or the other documents.

Failures: with `failures="record"` a document whose call fails (a `MemAgentError`: the backend gave up after
its retries, the document cannot be read) gets an error result and the others go on; with "raise" the run
stops with that error. In lock-step a failed batch is retried one prompt at a time, so only the documents
whose own call fails are failed. A failed document's generator is closed (its `finally` blocks run).
"""
from __future__ import annotations

import queue
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Iterator, Protocol

from memagent.agent.protocol import FAILURES, SCHEDULES, Call  # noqa: F401  (re-exported)
from memagent.backends.base import Generation, SamplingParams
from memagent.errors import MemAgentError

def call_seed(seed: int | None, call: int) -> int | None:
    """The sampling seed of the `call`-th model call (1, 2, ...) of a run under the config's `seed` (None:
    unseeded). A run's seeds depend on its seed and its inputs only, not on what the agent ran before."""
    return None if seed is None else seed * 1_000_003 + call


def doc_call_seed(seed: int | None, pos: int, k: int) -> int | None:
    """The seed of the `k`-th call (1, 2, ...) of the document at input position `pos` in a pipelined run:
    `call_seed(seed, k) + pos` (the lock-step seed of a one-document run, offset per document as a batch's
    requests are offset by their index)."""
    return None if seed is None else call_seed(seed, k) + pos


MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """SplitMix64's finaliser: a bijection of 64-bit integers that spreads nearby inputs apart."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def keyed_call_seed(seed: int | None, key: int, k: int) -> int | None:
    """The seed of the `k`-th call (1, 2, ...) of the document with seed key `key` (`AgentInput.seed_key`): a
    63-bit hash of (seed, key, k), so distinct documents and calls get unrelated seeds (unlike `doc_call_seed`,
    where key + k can repeat)."""
    if seed is None:
        return None
    return _mix64(_mix64(_mix64(seed & MASK64) ^ (key & MASK64)) ^ (k & MASK64)) >> 1


def doc_seed(seed: int | None, doc: Any, k: int) -> int | None:
    """The seed of `doc`'s k-th call: keyed by its `seed_key` when it has one, else by its input position."""
    key = getattr(doc, "seed_key", None)
    return doc_call_seed(seed, doc.pos, k) if key is None else keyed_call_seed(seed, key, k)


def batch_seeds(seed: int | None, docs: list[Any]) -> tuple[int, ...] | None:
    """Per-prompt seeds of a lock-step batch of `docs` (each about to make its next call), when any of them has a
    seed key: a keyed document's draws then depend on its key and call alone, not on the batch. None otherwise."""
    if seed is None or all(getattr(d, "seed_key", None) is None for d in docs):
        return None
    return tuple(doc_seed(seed, d, d.calls + 1) for d in docs)  # type: ignore[misc]


@dataclass
class RunStats:
    """What a run did: model calls made, and the most requests and documents it had in flight at once."""

    calls: int = 0
    max_calls_in_flight: int = 0
    max_docs_in_flight: int = 0
    failed: int = 0
    seconds: float = 0.0


class Steps(Protocol):
    """The per-document steps the scheduler drives (every Workflow implements them). A document state `doc`
    has `pos` (input position) and `calls` (model calls made so far)."""

    def start(self, pos: int, item: Any) -> Any: ...

    def next_call(self, doc: Any) -> Call: ...

    def take(self, doc: Any, call: Call, gen: Generation, seconds: float, batch_size: int) -> Any | None:
        """Apply the reply; the document's result when it is done, else None."""
        ...

    def fail(self, doc: Any, exc: BaseException) -> Any:
        """The error result of a document whose call failed."""
        ...

    def params(self, max_new_tokens: int, seed: int | None) -> SamplingParams: ...


class PoolSubmit:
    """`submit` for a thread-safe backend without one: each prompt is a `generate([prompt])` on a pool of
    `max_concurrency` threads."""

    def __init__(self, backend: Any, max_concurrency: int) -> None:
        self.backend, self.max_concurrency = backend, max_concurrency
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="memagent-submit")

    def submit(self, prompt: str, params: SamplingParams) -> "Future[Generation]":
        return self._pool.submit(lambda: self.backend.generate([prompt], params)[0])

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def concurrent(backend: Any) -> bool:
    """Whether `backend` takes single requests concurrently: it has a positive integer `max_concurrency`."""
    limit = getattr(backend, "max_concurrency", None)
    return isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1


def submitter(backend: Any) -> Any | None:
    """What takes single requests for `backend`: the backend itself when it has `submit`, a `PoolSubmit`
    when it has only `max_concurrency`, None for an in-process batch backend."""
    if not concurrent(backend):
        return None
    return backend if callable(getattr(backend, "submit", None)) else PoolSubmit(backend, backend.max_concurrency)


def resolve_schedule(schedule: str, backend: Any) -> str:
    """"auto" is "pipelined" for a concurrent backend and "lockstep" for an in-process one."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if schedule == "auto":
        return "pipelined" if concurrent(backend) else "lockstep"
    if schedule == "pipelined" and not concurrent(backend):
        raise ValueError("schedule 'pipelined' needs a concurrent backend (one with max_concurrency); "
                         "use 'lockstep' for in-process backends")
    return schedule


class _Pending:
    """The documents not started yet, read from `items` only when one is needed (an iterator: a stream)."""

    def __init__(self, items: Iterable[Any]) -> None:
        self._it: Iterator[tuple[int, Any]] = enumerate(items)
        self._next: tuple[int, Any] | None = None

    def __bool__(self) -> bool:
        if self._next is None:
            self._next = next(self._it, None)
        return self._next is not None

    def popleft(self) -> tuple[int, Any]:
        if not self:
            raise IndexError("no document left")
        item, self._next = self._next, None
        return item  # type: ignore[return-value]


class _Run:
    """State shared by both schedules: the queue, the results, the counts, the finish hook."""

    def __init__(self, steps: Steps, items: Iterable[Any], max_docs: int, failures: str,
                 on_result: Callable[[Any], None] | None, on_progress: Callable[[int, int, int], None] | None,
                 collect: bool = True):
        self.steps, self.max_docs, self.failures = steps, max_docs, failures
        self.pending = _Pending(items)
        self.collect = collect  # keep the results (in input order); a stream only passes them to on_result
        self.results: dict[int, Any] = {}
        self.on_result, self.on_progress = on_result, on_progress
        self.stats = RunStats()
        self.active = 0
        self._t0 = time.perf_counter()

    def admit(self) -> list[Any]:
        """Start documents while there is room; a document that cannot start is failed (or raises)."""
        started = []
        while self.pending and self.active < self.max_docs:
            pos, item = self.pending.popleft()
            self.active += 1
            self.stats.max_docs_in_flight = max(self.stats.max_docs_in_flight, self.active)
            try:
                started.append(self.steps.start(pos, item))
            except MemAgentError as exc:
                self.failed(_Started(pos, item), exc)
        return started

    def finish(self, doc: Any, result: Any, in_flight: int = 0) -> None:
        self.active -= 1
        if self.collect:
            self.results[doc.pos] = result
        if self.on_result is not None:
            self.on_result(result)
        if self.on_progress is not None:
            self.on_progress(1, self.stats.calls - in_flight, in_flight)

    def failed(self, doc: Any, exc: MemAgentError, in_flight: int = 0) -> None:
        if self.failures == "raise":
            raise exc
        self.stats.failed += 1
        self.finish(doc, self.steps.fail(doc, exc), in_flight=in_flight)

    def take(self, doc: Any, call: Call, gen: Generation, seconds: float, batch: int, in_flight: int) -> bool:
        """Apply one reply; True when the document is finished (done or failed)."""
        try:
            result = self.steps.take(doc, call, gen, seconds, batch)
        except MemAgentError as exc:  # e.g. the next chunk of the document cannot be read
            self.failed(doc, exc, in_flight)
            return True
        if result is None:
            return False
        self.finish(doc, result, in_flight=in_flight)
        return True

    def done(self) -> list[Any]:
        self.stats.seconds = time.perf_counter() - self._t0
        return [self.results[pos] for pos in sorted(self.results)]


@dataclass
class _Started:
    """A document that failed before its state existed (its first chunk could not be read)."""

    pos: int
    item: Any
    calls: int = 0


def run_pipelined(steps: Steps, backend: Any, items: Iterable[Any], max_docs: int, seed: int | None,
                  failures: str = "raise", on_result: Callable[[Any], None] | None = None,
                  on_progress: Callable[[int, int, int], None] | None = None,
                  collect: bool = True) -> tuple[list[Any], RunStats]:
    """Run `items` on a concurrent backend, each document's next call sent as its previous reply comes in."""
    sub = submitter(backend)
    run = _Run(steps, items, max_docs, failures, on_result, on_progress, collect)
    ready: deque[Any] = deque()
    flying: dict[Future, tuple[Any, Call, float]] = {}
    replies: queue.SimpleQueue[Future] = queue.SimpleQueue()  # futures as they complete (no scan of all)
    try:
        while run.pending or ready or flying:
            ready.extend(run.admit())
            while ready and len(flying) < sub.max_concurrency:
                doc = ready.popleft()
                call = steps.next_call(doc)
                doc.calls += 1
                params = steps.params(call.max_new_tokens, doc_seed(seed, doc, doc.calls))
                fut = sub.submit(call.prompt, params)
                flying[fut] = (doc, call, time.perf_counter())
                fut.add_done_callback(replies.put)
                run.stats.calls += 1
                run.stats.max_calls_in_flight = max(run.stats.max_calls_in_flight, len(flying))
            if not flying:
                continue
            for fut in sorted(_completed(replies), key=lambda f: flying[f][0].pos):
                doc, call, t0 = flying.pop(fut)
                try:
                    gen = fut.result()
                except MemAgentError as exc:
                    run.failed(doc, exc, len(flying))
                    continue
                if not run.take(doc, call, gen, time.perf_counter() - t0, 1, len(flying)):
                    ready.append(doc)
            if on_progress is not None:
                on_progress(0, run.stats.calls - len(flying), len(flying))
    finally:
        for fut in flying:
            fut.cancel()
        if sub is not backend:
            sub.close()
    return run.done(), run.stats


def _completed(replies: "queue.SimpleQueue[Future]") -> list[Future]:
    """The futures completed so far: waits for the first, then takes every one already there."""
    out = [replies.get()]
    while True:
        try:
            out.append(replies.get_nowait())
        except queue.Empty:
            return out


def run_lockstep(steps: Steps, backend: Any, items: Iterable[Any], max_docs: int, seed: int | None,
                 failures: str = "raise", on_result: Callable[[Any], None] | None = None,
                 on_progress: Callable[[int, int, int], None] | None = None,
                 collect: bool = True) -> tuple[list[Any], RunStats]:
    """Run `items` in batches: each round, the memory prompts of the documents in flight form one batch and the
    final prompts of those that read their last chunk another."""
    run = _Run(steps, items, max_docs, failures, on_result, on_progress, collect)
    active: list[Any] = []
    batch_no = 0  # batches of this run so far: with the seed, it seeds the next one
    while run.pending or active:
        active.extend(run.admit())
        calls = [(d, steps.next_call(d)) for d in active]
        for group in _groups(calls):
            batch_no += 1
            params = steps.params(group[0][1].max_new_tokens, call_seed(seed, batch_no))
            seeds = batch_seeds(seed, [d for d, _ in group])
            if seeds is not None:
                params = replace(params, seeds=seeds)
            finished = _run_batch(run, backend, group, params)
            active = [d for d in active if id(d) not in finished]
        if on_progress is not None:
            on_progress(0, run.stats.calls, 0)
    return run.done(), run.stats


def _groups(calls: list[tuple[Any, Call]]) -> list[list[tuple[Any, Call]]]:
    """The batches of one lock-step round: the calls of one (kind, output budget) each; "memory" first, "final"
    last, any other kind (a workflow's own, e.g. "query") between them in the order it first appears."""
    keys: dict[tuple[str, int], list[tuple[Any, Call]]] = {}
    for d, c in calls:
        keys.setdefault((c.kind, c.max_new_tokens), []).append((d, c))
    order = {"memory": 0, "final": 2}
    return [keys[k] for k in sorted(keys, key=lambda k: order.get(k[0], 1))]  # sorted is stable


def _run_batch(run: _Run, backend: Any, group: list[tuple[Any, Call]], params: SamplingParams) -> set[int]:
    """One backend batch; the ids of the documents it finished. A failed batch (failures="record") is retried
    prompt by prompt (seed + index, as a batch offsets its requests)."""
    t0 = time.perf_counter()
    run.stats.calls += len(group)
    run.stats.max_calls_in_flight = max(run.stats.max_calls_in_flight, len(group))
    for d, _ in group:
        d.calls += 1
    try:
        gens: list[Any] = backend.generate([c.prompt for _, c in group], params)
    except MemAgentError as exc:
        if run.failures == "raise":
            raise
        gens = [exc] if len(group) == 1 else [_one(backend, c.prompt, params, i) for i, (_, c) in enumerate(group)]
    seconds = time.perf_counter() - t0
    finished = set()
    for (doc, call), gen in zip(group, gens):
        if isinstance(gen, MemAgentError):
            run.failed(doc, gen)
            finished.add(id(doc))
        elif run.take(doc, call, gen, seconds, len(group), 0):
            finished.add(id(doc))
    return finished


def _one(backend: Any, prompt: str, params: SamplingParams, index: int) -> Generation | MemAgentError:
    seed = None if params.seed is None else params.seed + index
    seeds = None if params.seeds is None else (params.seeds[index],)
    try:
        return backend.generate([prompt], replace(params, seed=seed, seeds=seeds))[0]
    except MemAgentError as exc:
        return exc
