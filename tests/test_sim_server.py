"""bench/sim_server.py, the simulated OpenAI-compatible server the throughput benchmarks and tests use."""
from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from sim_server import SimServer, reply_text, straggles  # noqa: E402


def _chat(url: str, prompt: str) -> httpx.Response:
    return httpx.post(url + "/chat/completions", timeout=10,
                      json={"model": "sim", "messages": [{"role": "user", "content": prompt}], "max_tokens": 8})


def test_replies_are_a_function_of_the_prompt_and_the_cap_queues_the_rest():
    with SimServer(latency=0.05, max_concurrent=2).start() as s:
        with ThreadPoolExecutor(6) as pool:
            replies = list(pool.map(lambda i: _chat(s.url, f"p{i % 3}"), range(6)))
        stats = httpx.get(f"http://127.0.0.1:{s.port}/stats").json()
        done = httpx.post(s.url + "/completions", json={"model": "sim", "prompt": "p0", "max_tokens": 8}).json()
    texts = [r.json()["choices"][0]["message"]["content"] for r in replies]
    assert texts[:3] == texts[3:] == [reply_text("p0"), reply_text("p1"), reply_text("p2")]
    assert len(set(texts)) == 3 and texts[0].endswith("}") and "\\boxed{" in texts[0]
    assert done["choices"][0]["text"] == texts[0]
    assert stats["max_serving"] == 2 and 3 <= stats["max_in_flight"] <= 6  # six sent at once, two served at once
    assert stats["served"] == stats["received"] == 6 and stats["in_flight"] == 0


def test_stragglers_are_a_seeded_fraction_of_the_prompts():
    hits = [straggles(f"prompt {i}", 0, 0.1) for i in range(2000)]
    assert 150 < sum(hits) < 250  # 10% of 2000, +- 3.5 standard deviations
    assert hits == [straggles(f"prompt {i}", 0, 0.1) for i in range(2000)]
    assert hits != [straggles(f"prompt {i}", 1, 0.1) for i in range(2000)]
    assert not any(straggles(f"prompt {i}", 0, 0.0) for i in range(100))


def test_the_fail_marker_answers_500_and_kill_drops_requests_in_flight():
    with SimServer(latency=0.0, fail_marker="POISON").start() as s:
        assert _chat(s.url, "a POISON prompt").status_code == 500
        assert _chat(s.url, "a fine prompt").status_code == 200
        assert s.stats()["failed"] == 1
    with SimServer(latency=5.0).start() as s:
        threading.Timer(0.2, s.kill).start()
        with pytest.raises(httpx.TransportError):
            _chat(s.url, "never answered")
        with pytest.raises(httpx.TransportError):
            _chat(s.url, "refused")


def test_launched_as_its_own_process_it_serves_until_it_dies():
    """`launch` runs bench/sim_server.py as a program (it finds tests/loopback_http.py by path)."""
    from sim_server import launch

    proc, url = launch("--latency", "0", "--die-after", "2")
    try:
        assert httpx.get(url + "/models", timeout=10).json()["data"][0]["id"] == "sim"
        assert _chat(url, "p0").json()["choices"][0]["message"]["content"] == reply_text("p0")
        assert _chat(url, "p1").status_code == 200
        with pytest.raises(httpx.TransportError):  # the third request: the server stops
            _chat(url, "p2")
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
