"""The Ray runner: 2 local workers against 1, each worker bound by its own simulated server (issue 14).

`bench/sim_server.py` runs as one process per worker on 127.0.0.1: every reply takes LATENCY s and a
server serves at most SERVER_SLOTS requests at once (the rest queue), so one worker's throughput is its
server's. The same DOCS documents (CHUNKS chunks + 1 final call each) go through `ask`'s Ray driver
(`memagent.scale.runs.ray_ask`) with `--base-url URL1` (one actor) and `--base-url URL1,URL2` (two
actors, one per server), on one local Ray instance. Timed: from every actor ready (its backend built) to
the last result in the driver; the answers of both runs and of the plain runner (no Ray) are compared.
Writes bench/results/ray.json; headline `ray_scaling_2` (target >= 1.7).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from common import WORK, toy_documents, write_result
from sim_server import launch

from memagent.agent.workflow import AgentInput, MemoryAgent
from memagent.backends.options import BackendOptions
from memagent.backends.tiny import build_tokenizer
from memagent.config import AgentConfig
from memagent.protocol.profile import Profile, open_backend

DOCS, CHUNKS, CHUNK_TOKENS = 32, 7, 64
LATENCY, SERVER_SLOTS = 0.1, 4  # 40 calls/s a server at most
BATCH = 4  # documents a unit, and in flight on an actor: the server's slots
CONFIG = AgentConfig(chunk_tokens=CHUNK_TOKENS, memory_tokens=32, answer_tokens=16, query_tokens=16,
                     max_batch_docs=BATCH)


def documents(tok) -> list[AgentInput]:
    return toy_documents(tok, DOCS, CHUNKS, CHUNK_TOKENS, "town", "lake")


def ray_run(items, urls: list[str], tok_dir: Path) -> dict:
    from memagent.scale.options import RayOptions
    from memagent.scale.runs import ray_ask

    backend = BackendOptions(name="openai", base_url=",".join(urls), tokenizer=str(tok_dir),
                             max_concurrency=SERVER_SLOTS, max_retries=0)
    answers, marks = {}, {}

    def hook(pool, finished: int) -> None:  # finished == 0: every actor ready; then after each unit
        marks["ready" if finished == 0 else "done"] = time.perf_counter()

    ray_ask("sim", backend, Profile(), CONFIG, items, lambda r: answers.update({r.doc_id: r.answer}), None,
            RayOptions("local"), hook=hook)
    seconds = marks["done"] - marks["ready"]
    return dict(workers=len(urls), seconds=round(seconds, 3), docs_per_s=round(len(items) / seconds, 3),
                answers=answers)


def main() -> None:
    import ray

    tok = build_tokenizer()
    tok_dir = WORK / "ray_tokenizer"
    tok.save_pretrained(tok_dir)
    items = documents(tok)
    servers = [launch("--latency", str(LATENCY), "--max-concurrent", str(SERVER_SLOTS)) for _ in range(2)]
    urls = [url for _, url in servers]
    try:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
        one = ray_run(items, urls[:1], tok_dir)
        two = ray_run(items, urls, tok_dir)
        ray.shutdown()
        plain_backend = open_backend("sim", BackendOptions(name="openai", base_url=urls[0], tokenizer=str(tok_dir),
                                                           max_concurrency=SERVER_SLOTS, max_retries=0), Profile())
        plain = {r.doc_id: r.answer for r in MemoryAgent(plain_backend, CONFIG).run(items)}
    finally:
        for proc, _ in servers:
            proc.terminate()
            proc.wait(timeout=10)
    same = one.pop("answers") == two.pop("answers") == plain
    scaling = two["docs_per_s"] / one["docs_per_s"]
    headline = dict(ray_scaling_2=round(scaling, 3))
    for r in (one, two):
        print(f"{r['workers']} worker(s): {r['seconds']:6.2f} s  {r['docs_per_s']:6.2f} docs/s")
    print(headline, "answers identical to the plain runner's:", same)
    write_result("ray", dict(
        config=dict(docs=DOCS, calls_per_doc=CHUNKS + 1, chunk_tokens=CHUNK_TOKENS, batch_docs=BATCH,
                    max_concurrency=SERVER_SLOTS, server=f"bench/sim_server.py (own process each), {LATENCY} s a "
                    f"reply, {SERVER_SLOTS} served at once", timed="from every actor ready to the last result"),
        one_worker=one, two_workers=two, same_answers=same, targets=dict(ray_scaling_2=">= 1.7"),
        headline=headline))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
