"""Jobs: one document and one or more questions, run on a bounded thread pool over the shared backend.

Each finished chunk is persisted (its trace record, with the memory and offset after it) before the
next call, so `resume_all` after a restart goes on from the last finished chunk of every unfinished
job. Events (`step`, `answer`, `state`) are kept per job for the SSE stream: a new subscriber gets
every event so far, then the live ones.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from memagent.agent.chunking import iter_chunks
from memagent.agent.registry import DEFAULT_WORKFLOW, AgentInput, Runner, build_workflow, run_workflow
from memagent.config import AgentConfig
from memagent.errors import MemAgentError
from memagent.serve.backend import JobBackend, SharedBackend
from memagent.serve.documents import DocumentStore, new_id
from memagent.serve.errors import ApiError, JobCancelled
from memagent.serve.metrics import Metrics
from memagent.serve.store import UNFINISHED, Store
from memagent.timeline import evidence_steps

log = logging.getLogger(__name__)
TERMINAL = ("done", "failed", "cancelled")
_KEEP_FINISHED = 256  # finished jobs whose events stay in memory (older ones are rebuilt from SQLite)


MAX_LIST = 500  # jobs GET /v1/jobs lists at most


def evidence(steps: list[dict[str, Any]], empty_memory: str) -> list[int]:
    """The steps whose added words survive into the final memory (memagent.timeline)."""
    return evidence_steps(steps, empty_memory)


@dataclass
class Live:
    """A job's in-memory side: its events so far, and the flags its thread and subscribers share.

    Subscribers are async (the app's event loop) while the job runs in a thread: `emit` wakes every
    waiting subscriber through its loop (`call_soon_threadsafe`), so nobody polls.
    """

    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    state: str = "queued"
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    waiters: list[tuple[Any, Any]] = field(default_factory=list)  # (event loop, asyncio.Event)

    def emit(self, event: str, data: dict[str, Any], last: bool = False) -> None:
        """Add an event (`last`: the job's final one, marking it ended in the same step) and wake subscribers."""
        with self.lock:
            self.events.append((event, data))
            if last:
                self.done.set()
            waiters, self.waiters = self.waiters, []
        for loop, ev in waiters:
            loop.call_soon_threadsafe(ev.set)

    def start(self) -> bool:
        """queued -> running, unless cancelled first (then whoever cancelled finishes the job)."""
        with self.lock:
            if self.cancel.is_set():
                return False
            self.state = "running"
            return True

    def cancel_if_queued(self) -> bool:
        """Ask the job to stop; True when it had not started (the caller finishes it: no thread will)."""
        with self.lock:
            self.cancel.set()
            return self.state == "queued"

    def since(self, i: int) -> tuple[list[tuple[str, dict[str, Any]]], bool]:
        """Events from index `i` on, and whether the job has ended (no more will come)."""
        with self.lock:
            return self.events[i:], self.done.is_set()

    async def wait(self, i: int, timeout: float) -> None:
        """Return when there is an event past index `i`, the job has ended, or after `timeout` seconds."""
        loop, ev = asyncio.get_running_loop(), asyncio.Event()
        with self.lock:
            if len(self.events) > i or self.done.is_set():
                return
            self.waiters.append((loop, ev))
        try:
            await asyncio.wait_for(ev.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            with self.lock:
                if (loop, ev) in self.waiters:
                    self.waiters.remove((loop, ev))


class JobManager:
    """Submit, run, resume, cancel and describe jobs; `max_running` at once, `max_queued` waiting."""

    def __init__(self, store: Store, docs: DocumentStore, backend: SharedBackend, config: AgentConfig,
                 metrics: Metrics, max_running: int = 4, max_queued: int = 64,
                 workflow: str = DEFAULT_WORKFLOW, workflow_options: dict[str, Any] | None = None,
                 runner: Runner | None = None) -> None:
        self.store, self.docs, self.backend, self.config, self.metrics = store, docs, backend, config, metrics
        self.workflow = workflow  # the server's (serve --workflow); a job may name its own (`submit`), kept in SQLite
        self.workflow_options = dict(workflow_options or {})  # the server's workflow's (serve --workflow-option)
        self.runner = runner  # the server's workflow, built once (None: on the first job); a job binds it
        self.max_running, self.max_queued = max_running, max_queued
        self.pool = ThreadPoolExecutor(max_running, thread_name_prefix="memagent-job")
        self.live: OrderedDict[str, Live] = OrderedDict()
        self._lock = threading.Lock()
        self._stopping = False  # shutting down: running jobs stop but stay unfinished in SQLite (resumed later)

    # -- counts --------------------------------------------------------------------------------
    def count(self, state: str) -> int:
        with self._lock:
            return sum(1 for lv in self.live.values() if lv.state == state)

    # -- submit / resume / cancel ---------------------------------------------------------------
    def check_room(self) -> None:
        """429 (with Retry-After) when `max_running + max_queued` jobs are in flight."""
        with self._lock:
            self._check_room()

    def _check_room(self) -> None:  # under self._lock
        active = sum(1 for lv in self.live.values() if lv.state in UNFINISHED)
        if active >= self.max_running + self.max_queued:
            raise ApiError(429, f"the server is full ({active} jobs in flight, the limit of --max-jobs "
                                f"{self.max_running} + --max-queue {self.max_queued}); retry later",
                           "rate_limit_error", {"Retry-After": "1"})

    def submit(self, document_id: str, questions: list[str], chat: bool = False,
               workflow: str | None = None) -> tuple[str, Live]:
        """Queue a new job (429 when full); `chat`: a chat completion's, not resumed after a restart; `workflow`:
        the job's reading workflow (default: the server's)."""
        with self._lock:
            self._check_room()
            job_id = new_id("job")
            self.store.add_job(job_id, document_id, questions, chat, workflow or self.workflow)
            live = self._schedule(job_id)
        return job_id, live

    def resume_all(self) -> int:
        """Start again every job a previous server left queued or running; returns how many. A chat
        completion's job is cancelled instead: its client's connection died with that server."""
        ids = []
        for job_id, chat in self.store.unfinished():
            if chat:
                self.store.set_state(job_id, "cancelled", "the server stopped while its chat client waited")
            else:
                ids.append(job_id)
        with self._lock:
            for job_id in ids:
                self._schedule(job_id)
        if ids:
            log.warning("resuming %d unfinished job(s) from their last finished chunk", len(ids))
        return len(ids)

    def _schedule(self, job_id: str) -> Live:
        live = Live(events=self.events_from_db(job_id)[0])
        self.live[job_id] = live
        self._evict()
        self.pool.submit(self._run_safely, job_id, live)
        return live

    def _evict(self) -> None:
        finished = [k for k, lv in self.live.items() if lv.done.is_set()]
        for k in finished[: max(0, len(finished) - _KEEP_FINISHED)]:
            del self.live[k]

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Ask a job to stop (it stops before its next model call); its view. 404 for an unknown job."""
        self.job_or_404(job_id)
        live = self.live.get(job_id)
        if live is not None and not live.done.is_set() and live.cancel_if_queued():
            self._finish(job_id, live, "cancelled")  # not started: cancelled now, its thread does nothing
        return self.view(job_id)

    def subscribe(self, job_id: str) -> Live:
        """The job's event holder (a finished, evicted job's events rebuilt from SQLite)."""
        self.job_or_404(job_id)
        live = self.live.get(job_id)
        if live is None:
            events, _ = self.events_from_db(job_id)
            job = self.store.job(job_id)
            live = Live(events=events + [("state", dict(state=job["state"], error=job["error"]))],
                        state=job["state"])
            live.done.set()
        return live

    # -- the job's thread ---------------------------------------------------------------------
    def _run_safely(self, job_id: str, live: Live) -> None:
        if not live.start():
            return
        try:
            self._run(job_id, live)
            self._finish(job_id, live, "done")
        except JobCancelled:
            if not (self._stopping and not live.cancel.is_set()):
                self._finish(job_id, live, "cancelled")
        except MemAgentError as e:
            self._finish(job_id, live, "failed", self.backend.redact(str(e)))  # clients read it: no upstream key
        except Exception as e:  # noqa: BLE001  (a bug: the job fails, the server goes on)
            log.exception("job %s failed", job_id)
            self._finish(job_id, live, "failed", f"internal error ({type(e).__name__}); see the server log")

    def _finish(self, job_id: str, live: Live, state: str, error: str | None = None) -> None:
        self.store.set_state(job_id, state, error)
        live.state = state
        live.emit("state", dict(state=state, error=error), last=True)

    def _run(self, job_id: str, live: Live) -> None:
        job = self.store.job(job_id)
        path = self.docs.path(job["document_id"])
        self.store.set_state(job_id, "running")
        live.emit("state", dict(state="running", error=None))
        questions = self.store.questions(job_id)
        total = questions[0]["chunks_total"] if questions else 0
        if total is None:
            total = sum(1 for _ in iter_chunks(path, self.backend.tokenizer, self.config.chunk_tokens,
                                               errors="replace"))
            self.store.set_total(job_id, total)
        workflow = job["workflow"] or self.workflow  # None: a job of a version-1 database (not recorded)
        runner = self._runner() if workflow == self.workflow else build_workflow(workflow, self.backend, self.config)
        resume = getattr(runner.workflow, "resumable", False)  # declared beside it (@workflow(resumable=));
        #   another workflow's state is not only its memory and the chunk reached: it starts over
        items = [_resume_input(q, path) if resume else AgentInput(q["question"], path, doc_id=str(q["index"]))
                 for q in questions if q["final"] is None]
        if not resume:  # it starts over: the records of its first attempt go
            for q in questions:
                if q["final"] is None and q["steps"]:
                    self.store.clear_steps(job_id, q["index"])
                    q["steps"] = []
        done_steps = {q["index"]: list(q["steps"]) for q in questions}

        def on_usage(calls: int, prompt: int, completion: int) -> None:
            self.store.add_usage(job_id, calls, prompt, completion)
            self.metrics.tokens(prompt, completion)

        def on_step(record: dict[str, Any]) -> None:
            idx = int(record["doc_id"])
            if record.get("kind") == "final":
                ev = evidence(done_steps[idx], self.config.empty_memory)
                self.store.set_final(job_id, idx, record)
                live.emit("answer", dict(record, question_index=idx, evidence=ev))
                return
            self.store.add_step(job_id, idx, record)
            done_steps[idx].append(record)
            live.emit("step", dict(record, question_index=idx, chunks_total=total))

        backend = JobBackend(self.backend, on_usage, lambda: live.cancel.is_set() or self._stopping)
        run_workflow(runner.bind(backend, errors="replace", on_step=on_step), items)

    def _runner(self) -> Runner:
        """The server's workflow, built (and its options checked) once."""
        with self._lock:
            if self.runner is None:
                self.runner = build_workflow(self.workflow, self.backend, self.config, **self.workflow_options)
            return self.runner

    # -- views ----------------------------------------------------------------------------------
    def job_or_404(self, job_id: str) -> dict[str, Any]:
        job = self.store.job(job_id) if isinstance(job_id, str) else None
        if job is None:
            raise ApiError(404, f"no job {str(job_id)[:80]!r}; POST /v1/jobs returns job ids", "not_found_error")
        return job

    def view(self, job_id: str) -> dict[str, Any]:
        """GET /v1/jobs/{id}: state, and per question its progress, memory, answer and steps."""
        job = self.job_or_404(job_id)
        qs = []
        for q in self.store.questions(job_id):
            steps, final = q["steps"], q["final"] or {}
            qs.append(dict(index=q["index"], question=q["question"], chunks_done=len(steps),
                           chunks_total=q["chunks_total"], memory=_last_memory(steps),
                           answer=final.get("answer"), raw_answer=final.get("raw_answer"),
                           evidence=evidence(steps, self.config.empty_memory) if final else [], steps=steps))
        return dict(job, questions=qs)

    def recent(self, limit: int) -> dict[str, Any]:
        """GET /v1/jobs: the newest `limit` jobs (1..MAX_LIST), newest first, each {id, state, workflow, created,
        chat, error, questions, question}."""
        return {"object": "list", "data": self.store.recent(limit)}

    def chunk(self, job_id: str, chunk_no: int) -> dict[str, Any]:
        """GET /v1/jobs/{id}/chunks/{k}: the text of chunk number `k` of the job's document, as the job read it
        (the `chunk_text` of its memory record in SQLite); 404 for an unknown job or a chunk it has not read."""
        self.job_or_404(job_id)
        rec = self.store.chunk(job_id, chunk_no)
        if rec is None:
            read = self.store.chunks_read(job_id)
            span = f"it has read chunks {_spans(read)}" if read else "it has read no chunk yet"
            raise ApiError(404, f"job {job_id} has no chunk {chunk_no} ({span}); a chunk number is the `step` of "
                                "a memory record", "not_found_error")
        return dict(job_id=job_id, chunk=chunk_no, question_index=rec["question_index"],
                    chunk_start=rec.get("chunk_start"), chunk_tokens=rec.get("chunk_tokens"), text=rec["chunk_text"])

    def events_from_db(self, job_id: str) -> tuple[list[tuple[str, dict[str, Any]]], bool]:
        """The step and answer events of what SQLite holds, per question in order; and whether it ended."""
        events: list[tuple[str, dict[str, Any]]] = []
        for q in self.store.questions(job_id):
            for r in q["steps"]:
                events.append(("step", dict(r, question_index=q["index"], chunks_total=q["chunks_total"])))
            if q["final"] is not None:
                ev = evidence(q["steps"], self.config.empty_memory)
                events.append(("answer", dict(q["final"], question_index=q["index"], evidence=ev)))
        job = self.store.job(job_id)
        return events, job is not None and job["state"] in TERMINAL

    @property
    def stopping(self) -> bool:
        """Whether `shutdown` was called (the workers beside the jobs, e.g. the streams' keeper, stop too)."""
        return self._stopping

    def shutdown(self) -> None:
        """Stop the running jobs before their next call; they stay unfinished and resume on restart."""
        self._stopping = True
        self.pool.shutdown(wait=False, cancel_futures=True)


def _spans(numbers: list[int], most: int = 8) -> str:
    """Ascending numbers as ranges: [0, 1, 2, 5] -> "0-2, 5" (the first `most` ranges, then "...")."""
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    text = [f"{a}-{b}" if b > a else str(a) for a, b in spans[:most]]
    return ", ".join(text + (["..."] if len(spans) > most else []))


def _last_memory(steps: list[dict[str, Any]]) -> str | None:
    """The memory after the last memory step (records of other kinds, e.g. a lookup query, carry none)."""
    mem = [r["memory"] for r in steps if r.get("kind", "memory") == "memory" and "memory" in r]
    return mem[-1] if mem else None


def _resume_input(q: dict[str, Any], path: Any) -> AgentInput:
    """The agent input of a question: from the start, or after its last persisted chunk."""
    item = AgentInput(q["question"], path, doc_id=str(q["index"]))
    if not q["steps"]:
        return item
    last = q["steps"][-1]
    return replace(item, memory=last["memory"], start_token=last["chunk_start"] + last["chunk_tokens"],
                   start_step=last["step"] + 1)
