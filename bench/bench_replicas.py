"""4 replicas against 1 behind the `openai` backend: documents/s in one run [replica_scaling_4].

Each replica is a simulated server (bench/sim_server.py) in its own process on 127.0.0.1 that serves at
most 8 requests at once (the rest queue) and sleeps a fixed time per reply (`--latencies`: 0.25 s for the
headline, also 0.1 s). A document is a chain of
`--calls` dependent calls: the next prompt holds the previous reply, so it goes out only once that reply
is in. Two drivers (`--driver`): `agent` runs MemoryAgent with per-document pipelining
(`schedule="pipelined"`, documents of calls - 1 chunks plus the answer call), used when that scheduler is
there; `submit` drives `OpenAIBackend.submit` directly with future callbacks (a document's next call
holds its previous reply). Either way at most `--docs-in-flight` documents at once, one call in flight
per document (also the client's max_concurrency).

The same documents run against 1 replica and against 4; the final replies must be equal (the reply is a
function of the request), and the ratio of documents/s is the headline. 64 documents in flight keep both
setups saturated (4 x 8 = 32 served at once). The client is one event-loop thread spending ~2 ms of CPU
per call (mostly the SDK): at 0.1 s per reply 4 replicas need ~320 calls/s, which a loaded 2-core machine
cannot give it, so the 0.1 s ratio measures the host as much as the routing. Also measured: the transport's
time per call against one zero-latency replica, calls one after another (client and server together).

    python bench/bench_replicas.py            # writes bench/results/replicas.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import threading
import time
import urllib.request
from typing import Any

from common import tiny_model, write_result  # common puts src/ on the path
from sim_server import launch

from memagent.backends.base import SamplingParams
from memagent.backends.openai import OpenAIBackend



DRIVERS = {"agent": "MemoryAgent, per-document pipelining (schedule='pipelined')",
           "submit": "documents as chains of dependent calls driven by OpenAIBackend.submit directly (MemoryAgent's "
                     "pipelining scheduler was not on this branch)"}


def start_replicas(n: int, latency: float, max_concurrent: int) -> list[tuple[subprocess.Popen, str]]:
    """n simulated servers, each in its own process; (process, base URL) once each listens."""
    return [launch("--latency", str(latency), "--max-concurrent", str(max_concurrent)) for _ in range(n)]


def stats(url: str) -> dict[str, int]:
    return json.loads(urllib.request.urlopen(url.removesuffix("/v1") + "/stats", timeout=5).read())


def run_documents(backend: OpenAIBackend, n_docs: int, calls: int, docs_in_flight: int) -> tuple[float, list[str]]:
    """(seconds, the last reply of each document) for `n_docs` chains of `calls` dependent calls."""
    params = SamplingParams(16)
    finals: list[str] = [""] * n_docs
    lock, done = threading.Lock(), threading.Event()
    state = dict(next_doc=0, finished=0, error=None)

    def step(doc: int, k: int, previous: str) -> None:
        fut = backend.submit(f"document {doc} step {k} memory: {previous}", params)
        fut.add_done_callback(lambda f: on_reply(doc, k, f))

    def on_reply(doc: int, k: int, fut: Any) -> None:
        if fut.exception() is not None:
            state["error"] = fut.exception()
            done.set()
            return
        text = fut.result().text
        if k + 1 < calls:
            step(doc, k + 1, text)
            return
        finals[doc] = text
        with lock:
            state["finished"] += 1
            start_next = state["next_doc"] < n_docs
            nxt = state["next_doc"]
            state["next_doc"] += int(start_next)
            if state["finished"] == n_docs:
                done.set()
        if start_next:
            step(nxt, 0, "")

    t0 = time.perf_counter()
    first = min(docs_in_flight, n_docs)
    state["next_doc"] = first
    for d in range(first):
        step(d, 0, "")
    done.wait()
    if state["error"] is not None:
        raise state["error"]
    return time.perf_counter() - t0, finals


def has_pipelining() -> bool:
    """Whether MemoryAgent takes `schedule=` (per-document pipelining, issue 14's scheduler)."""
    import inspect

    from memagent.agent.workflow import MemoryAgent

    return "schedule" in inspect.signature(MemoryAgent.__init__).parameters


def run_agent(backend: OpenAIBackend, n_docs: int, calls: int, docs_in_flight: int) -> tuple[float, list[Any]]:
    """(seconds, each document's answer): MemoryAgent, pipelined, over documents of `calls - 1` chunks."""
    from memagent.agent.workflow import AgentInput, MemoryAgent
    from memagent.config import AgentConfig

    cfg = AgentConfig(chunk_tokens=64, memory_tokens=32, answer_tokens=16, query_tokens=16,
                      max_batch_docs=docs_in_flight)
    items = []
    for i in range(n_docs):
        words: list[str] = []
        while len(backend.tokenizer(" ".join(words), add_special_tokens=False)["input_ids"]) < (calls - 1) * 60:
            words.append(f"harbour{i} lantern{len(words)}")
        items.append(AgentInput(f"which lantern is in harbour {i}?", " ".join(words), f"d{i}"))
    agent = MemoryAgent(backend, cfg, schedule="pipelined")  # type: ignore[call-arg]
    t0 = time.perf_counter()
    results = agent.run(items)
    return time.perf_counter() - t0, [(r.num_chunks, r.answer) for r in results]


def measure(urls: list[str], tokenizer: str, a: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    backend = OpenAIBackend("sim", base_url=",".join(urls), tokenizer=tokenizer, max_concurrency=a.docs_in_flight,
                            timeout=60.0)
    backend.generate([f"warm-up {i}" for i in range(len(urls) * 4)], SamplingParams(4))
    before = [stats(u)["served"] for u in urls]
    cpu0 = time.process_time()
    drive = run_agent if a.driver == "agent" else run_documents
    seconds, finals = drive(backend, a.docs, a.calls, a.docs_in_flight)
    cpu = time.process_time() - cpu0  # this process: the client alone (the replicas run in their own)
    served = [stats(u)["served"] - b for u, b in zip(urls, before)]
    peak = [stats(u)["max_serving"] for u in urls]
    backend.close()
    row = dict(replicas=len(urls), seconds=round(seconds, 3), docs_per_s=round(a.docs / seconds, 2),
               calls_per_s=round(a.docs * a.calls / seconds, 1),
               client_cpu_ms_per_call=round(cpu / (a.docs * a.calls) * 1000, 2), served_per_replica=served,
               max_serving_per_replica=peak)
    print(json.dumps(row), flush=True)
    return row, finals


def ms_per_call(url: str, tokenizer: str, n: int = 200) -> float:
    backend = OpenAIBackend("sim", base_url=url, tokenizer=tokenizer)
    backend.generate(["warm-up"], SamplingParams(4))
    t0 = time.perf_counter()
    for i in range(n):
        backend.generate([f"call {i}"], SamplingParams(4))
    backend.close()
    return (time.perf_counter() - t0) / n * 1000


def scaling_at(latency: float, tokenizer: str, a: argparse.Namespace) -> dict[str, Any]:
    """1 replica, then 4, against servers that take `latency` s per reply."""
    servers = start_replicas(4, latency, a.max_concurrent)
    try:
        urls = [u for _, u in servers]
        one, finals_one = measure(urls[:1], tokenizer, a)
        four, finals_four = measure(urls, tokenizer, a)
    finally:
        for p, _ in servers:
            p.kill()
            p.wait()
    return dict(latency_s=latency, one_replica=one, four_replicas=four, same_final_replies=finals_one == finals_four,
                replica_scaling_4=round(four["docs_per_s"] / one["docs_per_s"], 2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--latencies", default="0.25,0.1", help="seconds per reply; the headline is the first")
    ap.add_argument("--max-concurrent", type=int, default=8, help="requests one replica serves at once")
    ap.add_argument("--docs", type=int, default=64)
    ap.add_argument("--calls", type=int, default=10, help="dependent calls per document")
    ap.add_argument("--docs-in-flight", type=int, default=64, help="also the client's max_concurrency")
    ap.add_argument("--driver", choices=("agent", "submit"), default=None,
                    help="default: agent when MemoryAgent pipelines documents, else submit")
    a = ap.parse_args()
    a.driver = a.driver or ("agent" if has_pipelining() else "submit")
    tokenizer = str(tiny_model())  # its tokenizer counts prompt tokens; the sim servers run no model
    runs = [scaling_at(float(x), tokenizer, a) for x in a.latencies.split(",")]
    zero = start_replicas(1, 0.0, 64)
    try:
        client_ms = ms_per_call(zero[0][1], tokenizer)
    finally:
        zero[0][0].kill()
        zero[0][0].wait()
    write_result("replicas", dict(
        setup=dict(max_concurrent_per_replica=a.max_concurrent, documents=a.docs, calls_per_document=a.calls,
                   docs_in_flight=a.docs_in_flight, client_max_concurrency=a.docs_in_flight,
                   driver=DRIVERS[a.driver], replicas="simulated servers, each in its own process"),
        runs=runs, transport_ms_per_call_zero_latency=round(client_ms, 2),
        headline=dict(replica_scaling_4=runs[0]["replica_scaling_4"]),
    ))
    for r in runs:
        print(f"latency {r['latency_s']} s: replica_scaling_4 = {r['replica_scaling_4']:.2f} (target >= 3.5); "
              f"same replies: {r['same_final_replies']}")
    print(f"{client_ms:.2f} ms per call at zero latency, one call after another")


if __name__ == "__main__":
    main()
