"""The scheduler (memagent.agent.scheduler): pipelined documents give lock-step's greedy results, stay within
max_concurrency and max_batch_docs, seed by document and step, and a failing document is recorded while the
others complete."""
from __future__ import annotations

import random
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from memagent.agent.scheduler import PoolSubmit, concurrent, doc_call_seed, resolve_schedule, submitter
from memagent.agent.workflow import AgentInput, MemoryAgent
from memagent.backends.base import BackendError, ConcurrentBackend, Generation, SamplingParams
from memagent.config import AgentConfig
from memagent.progress import CallRate, call_figures

from fakes import ScriptedBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from sim_server import SimServer  # noqa: E402

SMALL = dict(chunk_tokens=20, memory_tokens=8, answer_tokens=8, query_tokens=16)
SCRIPT = dict(memory_template="Q:{question}|M:{memory}|C:{chunk}|", final_template="Q:{question}|M:{memory}|A:")


def _docs(n: int) -> list[AgentInput]:
    """n documents of 1, 2, 3, 4, 1, ... chunks of 20 tiny-tokenizer tokens (about 6 tokens a phrase)."""
    return [AgentInput(f"where is river {i}?", " ".join(f"city river{i} w{j}" for j in range(3 * (1 + i % 4))),
                       f"d{i}") for i in range(n)]


def _view(results) -> list[tuple]:
    return [(r.doc_id, r.answer, r.raw_answer, r.memory, r.num_chunks, [c.text for c in r.conversations])
            for r in results]


class Locked:
    """The tiny model as a concurrent backend: `max_concurrency` requests at once, one generation at a time."""

    def __init__(self, backend, max_concurrency: int) -> None:
        self.inner, self.max_concurrency = backend, max_concurrency
        self.tokenizer, self.max_window = backend.tokenizer, backend.max_window
        self._lock = threading.Lock()

    def prompt_length(self, prompt: str) -> int:
        return self.inner.prompt_length(prompt)

    def generate(self, prompts, params):
        with self._lock:
            return self.inner.generate(prompts, params)


def test_greedy_pipelined_equals_lockstep_on_the_tiny_model(tiny_backend):
    cfg = AgentConfig(**SMALL, max_batch_docs=3)
    items = _docs(5)
    lock = MemoryAgent(tiny_backend, cfg, keep_conversations=True).run(items)
    piped = MemoryAgent(Locked(tiny_backend, 2), cfg, keep_conversations=True)
    assert piped.schedule == "auto" and resolve_schedule("auto", piped.backend) == "pipelined"
    assert isinstance(submitter(piped.backend), PoolSubmit)  # no submit of its own: a pool of 2 threads
    got = piped.run(items)
    assert [r.num_chunks for r in lock] == [1, 2, 3, 4, 1]
    assert _view(got) == _view(lock)
    assert piped.stats.calls == sum(r.num_chunks + 1 for r in lock) == 16
    assert piped.stats.max_calls_in_flight == 2 and piped.stats.max_docs_in_flight == 3


class Counting(MemoryAgent):
    """Counts the documents between their start and their result, independently of the scheduler's own count."""

    def run(self, items, on_result=None):
        self.open, self.most = 0, 0

        def done(result):
            self.open -= 1

        return super().run(items, on_result=done)

    def start(self, pos, item):
        self.open += 1
        self.most = max(self.most, self.open)
        return super().start(pos, item)


@pytest.mark.parametrize("max_concurrency, batch_docs", [(3, 6), (8, 2)])
def test_through_the_sim_server_within_both_bounds_and_equal_to_lockstep(tiny_tokenizer, max_concurrency, batch_docs):
    from memagent.backends.openai import OpenAIBackend

    cfg = AgentConfig(**SMALL, **SCRIPT, max_batch_docs=batch_docs)
    items = _docs(8)
    with SimServer(latency=0.01, straggler_p=0.3, straggler_x=5).start() as server:
        backend = OpenAIBackend("sim", server.url, tiny_tokenizer, max_concurrency=max_concurrency, max_retries=0)
        agent = Counting(backend, cfg)
        piped = agent.run(items)
        bound = min(max_concurrency, batch_docs)
        assert agent.stats.max_calls_in_flight == bound and 2 <= server.stats()["max_in_flight"] <= bound
        assert agent.most == agent.stats.max_docs_in_flight == batch_docs
        server.reset_stats()
        lock = MemoryAgent(backend, cfg, schedule="lockstep").run(items)
        assert server.stats()["max_in_flight"] <= max_concurrency
    assert _view(piped) == _view(lock)
    assert all(r.answer and r.error is None for r in piped)


def test_a_document_whose_requests_always_fail_is_recorded_while_the_rest_complete(tiny_tokenizer):
    from memagent.backends.openai import OpenAIBackend

    cfg = AgentConfig(**SMALL, **SCRIPT, max_batch_docs=4)
    items = _docs(6)
    items[2] = AgentInput("where is POISON?", items[2].document, "d2")  # every call of d2 holds the marker
    with SimServer(latency=0.005, fail_marker="POISON").start() as server:
        backend = OpenAIBackend("sim", server.url, tiny_tokenizer, max_concurrency=4, max_retries=1, backoff=0.01)
        got = MemoryAgent(backend, cfg, failures="record").run(items)
        assert server.stats()["failed"] == 2  # the first call of d2, tried twice
        ref = MemoryAgent(backend, cfg).run(items[:2] + items[3:])
        with pytest.raises(BackendError, match="failed all 2 tries"):
            MemoryAgent(backend, cfg).run(items)  # failures="raise": the run stops
    bad = got[2]
    assert (bad.doc_id, bad.answer, bad.num_chunks) == ("d2", None, 0)
    assert bad.error["kind"] == "BackendError" and bad.error["attempts"] == 2 and "HTTP 500" in bad.error["message"]
    assert _view(got[:2] + got[3:]) == _view(ref)


def test_lockstep_retries_a_failed_batch_prompt_by_prompt(tiny_tokenizer):
    def reply(prompt: str, call: int) -> str:
        if "POISON" in prompt:
            raise BackendError("gave up after 3 tries")
        return "note \\boxed{x}"

    backend = ScriptedBackend(tiny_tokenizer, reply)
    items = _docs(3)
    items[1] = AgentInput("POISON?", "short text", "d1")
    got = MemoryAgent(backend, AgentConfig(**SMALL, **SCRIPT), failures="record").run(items)
    assert [r.answer for r in got] == ["x", None, "x"]
    assert got[1].error == dict(kind="BackendError", message="gave up after 3 tries", attempts=1)
    assert [len(b) for b in backend.batches[:4]] == [3, 1, 1, 1]  # the batch, then each prompt alone


class Shuffled:
    """A concurrent backend whose replies come back after random delays (a fixed reply per prompt)."""

    def __init__(self, tokenizer, rng: random.Random) -> None:
        self.tokenizer, self.max_window, self.max_concurrency = tokenizer, None, 4
        self.rng, self.seeds = rng, {}
        self._pool = ThreadPoolExecutor(4)

    def prompt_length(self, prompt: str) -> int:
        return len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def generate(self, prompts, params):
        raise AssertionError("a pipelined run sends single requests")

    def submit(self, prompt: str, params: SamplingParams) -> "Future[Generation]":
        self.seeds[prompt] = params.seed
        delay = self.rng.random() * 0.01
        return self._pool.submit(lambda: (time.sleep(delay), Generation(text=f"m{len(prompt)}"))[1])


def test_pipelined_seeds_follow_the_document_and_its_step_not_the_timing(tiny_tokenizer):
    cfg = AgentConfig(**SMALL, **SCRIPT, temperature=1.0, seed=7, max_batch_docs=3)
    items = _docs(5)
    runs = []
    for seed in (1, 2):
        backend = Shuffled(tiny_tokenizer, random.Random(seed))
        assert isinstance(backend, ConcurrentBackend) and submitter(backend) is backend
        MemoryAgent(backend, cfg).run(items)
        runs.append(backend.seeds)
    assert runs[0] == runs[1] and len(runs[0]) == 16
    d3 = sorted(s for p, s in runs[0].items() if p.startswith("Q:where is river 3?"))
    assert d3 == [doc_call_seed(7, 3, k) for k in range(1, 6)] == [7_000_024 + k for k in range(1, 6)]
    # one document: the seeds a lock-step run gives it (7 * 1_000_003 + call)
    one = Shuffled(tiny_tokenizer, random.Random(3))
    MemoryAgent(one, cfg).run(items[1:2])
    lock = ScriptedBackend(tiny_tokenizer, lambda p, c: f"m{len(p)}")
    MemoryAgent(lock, cfg).run(items[1:2])
    assert sorted(one.seeds.values()) == [p.seed for p in lock.params] == [7_000_022, 7_000_023, 7_000_024]


def test_pipelined_needs_a_concurrent_backend(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, lambda p, c: "x")
    assert resolve_schedule("auto", backend) == "lockstep" and submitter(backend) is None and not concurrent(backend)
    with pytest.raises(ValueError, match="needs a concurrent backend"):
        MemoryAgent(backend, AgentConfig(**SMALL), schedule="pipelined")
    with pytest.raises(ValueError, match="schedule must be one of"):
        MemoryAgent(backend, AgentConfig(**SMALL), schedule="fast")


def test_call_figures():
    assert call_figures(120, 8, 8.0) == "calls 120 (15.0/s), 8 in flight"
    assert call_figures(0, 0, 0.0) == "calls 0 (?/s), 0 in flight"
    clock = iter([10.0, 14.0]).__next__
    assert CallRate(clock).info(10, 3) == "calls 10 (2.5/s), 3 in flight"
