"""Replicas of one server behind the `openai` backend: the routing rule by hand, then real servers on loopback."""
from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from memagent.backends.base import BackendError, SamplingParams
from memagent.backends.openai import OpenAIBackend, public_url
from memagent.backends.replicas import Router, rest_seconds, split_base_urls

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
from sim_server import SimServer, reply_text  # noqa: E402

CHAT = "/v1/chat/completions"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


# -- the routing rule, by hand ---------------------------------------------------------------------


def test_rest_doubles_from_backoff_up_to_the_cap():
    assert [rest_seconds(k, 1.0, 8.0) for k in (1, 2, 3, 4, 5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert rest_seconds(3, 0.25, 30.0) == 1.0


def test_fewest_outstanding_first_lowest_number_on_a_tie():
    r = Router(3)
    picks = []
    for _ in range(5):
        i = r.pick(0.0)
        r.start(i)
        picks.append(i)
    assert picks == [0, 1, 2, 0, 1]  # outstanding now [2, 2, 1]
    assert r.pick(0.0) == 2
    r.finish(0, 0.0)
    r.finish(0, 0.0)  # [0, 2, 1]
    assert r.pick(0.0) == 0
    assert [s.sent for s in r.replicas] == [2, 2, 1]


def test_a_failed_replica_rests_then_comes_back():
    r = Router(2, backoff=1.0, max_backoff=8.0)
    r.start(0)
    r.finish(0, 10.0, ok=False)  # first failure in a row: rests 1 s, until 11
    assert r.resting(10.5) == [0] and r.pick(10.5) == 1
    assert r.resting(11.0) == [] and r.pick(11.0) == 0  # the rest is over: lowest number again
    r.start(0)
    r.finish(0, 11.0, ok=False)  # second in a row: 2 s, until 13
    assert r.pick(12.9) == 1 and r.pick(13.0) == 0
    r.start(0)
    r.finish(0, 13.0, ok=True)  # answered: the run of failures ends
    r.start(0)
    r.finish(0, 20.0, ok=False)  # first in a row again: 1 s
    assert r.pick(20.9) == 1 and r.pick(21.0) == 0
    assert (r.replicas[0].sent, r.replicas[0].failed, r.replicas[0].outstanding) == (4, 3, 0)


def test_retry_after_lengthens_the_rest_up_to_the_cap():
    r = Router(2, backoff=1.0, max_backoff=8.0)
    r.start(0)
    r.finish(0, 0.0, ok=False, retry_after=5.0)
    r.start(1)
    r.finish(1, 0.0, ok=False, retry_after=100.0)
    assert r.replicas[0].rest_until == 5.0 and r.replicas[1].rest_until == 8.0


def test_excluded_or_resting_everywhere_gives_none_unless_probing():
    r = Router(3, backoff=1.0, max_backoff=8.0)
    assert r.pick(0.0, exclude={0, 2}) == 1
    assert r.pick(0.0, exclude={0, 1, 2}) is None
    for i, now in ((0, 3.0), (1, 1.0), (2, 2.0)):  # rests until 4, 2, 3
        r.start(i)
        r.finish(i, now, ok=False)
    assert r.pick(1.5) is None
    assert r.pick(1.5, probe=True) == 1  # the rest that ends first
    assert r.pick(1.5, exclude={1}, probe=True) == 2
    assert r.pick(2.0) == 1  # its rest is over


def test_base_url_lists_are_checked_and_printed_without_credentials():
    assert split_base_urls("http://a:1/v1, http://b:2/v1/") == ["http://a:1/v1", "http://b:2/v1"]
    with pytest.raises(BackendError, match="empty item"):
        split_base_urls("http://a:1/v1,,http://b:2/v1")
    with pytest.raises(BackendError, match="twice") as e:
        split_base_urls("http://u:pw-secret@a:1/v1,http://u:pw-secret@a:1/v1")
    assert "pw-secret" not in str(e.value)
    assert public_url("http://u:p@a:1/v1?k=s,https://b/v1") == "http://a:1/v1,https://b/v1"


# -- real servers on 127.0.0.1 ----------------------------------------------------------------------


def sim_backend(servers, tiny_model_dir, **kw):
    kw = dict(dict(model="sim", base_url=",".join(s.url for s in servers), tokenizer=tiny_model_dir, timeout=5.0,
                   backoff=0.05, max_backoff=0.5, retry_seed=0), **kw)
    return OpenAIBackend(**kw)


def test_submit_spreads_over_replicas_and_keeps_the_replies(tiny_model_dir):
    with SimServer(latency=0.05).start() as a, SimServer(latency=0.05).start() as b:
        backend = sim_backend([a, b], tiny_model_dir, max_concurrency=4)
        prompts = [f"question {i}" for i in range(16)]
        futures = [backend.submit(p, SamplingParams(8)) for p in prompts]
        assert [f.result(timeout=20).text for f in futures] == [reply_text(p) for p in prompts]
        sa, sb = a.stats(), b.stats()
        backend.close()
    assert sa["served"] + sb["served"] == 16 and sa["served"] >= 4 and sb["served"] >= 4
    assert sa["max_in_flight"] <= 4 and sb["max_in_flight"] <= 4


def test_replica_killed_mid_run_nothing_lost_nothing_twice(tiny_model_dir):
    """Replica a dies on its 7th request (that one and the others in flight there get no reply)."""
    with SimServer(latency=0.05, die_after=6).start() as a, SimServer(latency=0.05).start() as b:
        backend = sim_backend([a, b], tiny_model_dir, max_concurrency=6, max_retries=2)
        prompts = [f"document {i} call" for i in range(40)]
        futures = {p: backend.submit(p, SamplingParams(8)) for p in prompts}
        results = Counter()
        for p, f in futures.items():
            assert f.result(timeout=30).text == reply_text(p)
            results[p] += 1
        sa, sb = a.stats(), b.stats()
        backend.close()
    assert results == Counter(prompts)  # every id once
    # it died on its 7th request; requests in flight there (and any sent on a kept-alive connection after) got
    # no reply and went to b
    assert sa["received"] >= 7 and sa["served"] <= 6 and sa["received"] > sa["served"]
    assert sa["served"] + sb["served"] == 40  # each reply was sent exactly once
    assert sb["received"] == 40 - sa["served"]


def test_failed_replica_rests_and_its_request_goes_to_the_other(openai_server, tiny_backend, tiny_model_dir):
    from fake_openai_server import FakeOpenAIServer

    second = FakeOpenAIServer(tiny_backend).start()
    try:
        b = OpenAIBackend("tiny", base_url=f"{openai_server.url},{second.url}", tokenizer=tiny_model_dir,
                          max_concurrency=1, backoff=1.0, max_backoff=2.0, retry_seed=0, check_server=False)
        openai_server.fail_next(1, 503)
        params = SamplingParams(4)
        want = tiny_backend.generate(["hello"], params)[0].text
        assert b.generate(["hello"], params)[0].text == want  # a: 503, rested; b answers at once
        assert (openai_server.attempts[CHAT], second.attempts[CHAT]) == (1, 1)
        b.generate(["hello"], params)  # a rests 1 s after its first failure: b again
        assert (openai_server.attempts[CHAT], second.attempts[CHAT]) == (1, 2)
        time.sleep(1.05)
        b.generate(["hello"], params)  # the rest is over: a, the lowest number, on a tie
        assert (openai_server.attempts[CHAT], second.attempts[CHAT]) == (2, 2)
    finally:
        second.stop()


def test_results_do_not_depend_on_the_number_of_replicas(openai_server, tiny_backend, tiny_model_dir):
    from fake_openai_server import FakeOpenAIServer

    second = FakeOpenAIServer(tiny_backend).start()
    second._model_lock = openai_server._model_lock  # one model in one process: its sampling RNG is global
    try:
        prompts = ["hello world", "the answer is", "a river", "the city"]
        params = SamplingParams(8, temperature=1.0, seed=3)
        one = OpenAIBackend("tiny", base_url=openai_server.url, tokenizer=tiny_model_dir, check_server=False)
        two = OpenAIBackend("tiny", base_url=f"{openai_server.url},{second.url}", tokenizer=tiny_model_dir,
                            max_concurrency=4, check_server=False)
        openai_server.latency = second.latency = 0.05  # requests overlap, so both replicas serve
        texts = [g.text for g in two.generate(prompts, params)]
        assert second.attempts[CHAT] >= 1 and openai_server.attempts[CHAT] >= 1
        assert texts == [g.text for g in one.generate(prompts, params)]
        assert len(set(texts)) == 4
    finally:
        second.stop()


def test_a_request_that_always_fails_tries_every_replica_each_round(tiny_model_dir):
    with SimServer(latency=0.0, fail_marker="BAD").start() as a, SimServer(latency=0.0, fail_marker="BAD").start() as b:
        backend = sim_backend([a, b], tiny_model_dir, max_retries=1)
        with pytest.raises(BackendError, match=r"last of 2 replicas\) failed all 4 tries \(last: HTTP 500") as e:
            backend.generate(["a BAD prompt"], SamplingParams(4))
        assert e.value.attempts == 4  # the failure record's count
        assert (a.stats()["failed"], b.stats()["failed"]) == (2, 2)  # 2 rounds x 2 replicas
        assert backend.generate(["a good prompt"], SamplingParams(4))[0].text == reply_text("a good prompt")
        backend.close()


def test_an_unreachable_replica_at_start_is_a_warning(tiny_model_dir, refused_url, caplog):
    with SimServer(latency=0.0).start() as a:
        backend = OpenAIBackend("sim", base_url=f"{refused_url},{a.url}", tokenizer=tiny_model_dir, max_retries=0,
                                backoff=0.05)
        assert backend.max_window == 32768
        assert "unreachable" in caplog.text and "other replicas" in caplog.text
        assert backend.generate(["hi"], SamplingParams(4))[0].text == reply_text("hi")
        backend.close()
    with pytest.raises(BackendError, match="unreachable after 1 tries"):
        OpenAIBackend("sim", base_url=refused_url, tokenizer=tiny_model_dir, max_retries=0)


def test_submit_is_bounded_and_a_cancelled_request_is_never_sent(tiny_model_dir):
    with SimServer(latency=0.1).start() as a:
        backend = sim_backend([a], tiny_model_dir, max_concurrency=3)
        futures = [backend.submit(f"q{i}", SamplingParams(4)) for i in range(9)]
        late = backend.submit("never sent", SamplingParams(4))
        assert late.cancel()  # still waiting for a slot behind nine others
        assert [f.result(timeout=20).text for f in futures] == [reply_text(f"q{i}") for i in range(9)]
        stats = a.stats()
        backend.close()
    assert stats["max_in_flight"] == 3 and stats["received"] == 9 and late.cancelled()


def test_cli_ask_over_two_replicas(tiny_model_dir, tmp_path, run_cli):
    doc = tmp_path / "doc.txt"
    doc.write_text(" ".join(f"Paragraph {i}: the bridge {i * 13} crosses the river." for i in range(12)))
    with SimServer(latency=0.02).start() as a, SimServer(latency=0.02).start() as b:
        code, out, err = run_cli("ask", "--backend", "openai", "--model", "sim", "--base-url", f"{a.url},{b.url}",
                                 "--tokenizer", str(tiny_model_dir), "--document", str(doc), "--question", "Which?",
                                 "--chunk-tokens", "48", "--memory-tokens", "12", "--answer-tokens", "12",
                                 "--query-tokens", "32", "--no-progress")
        served = a.stats()["served"], b.stats()["served"]
    assert code == 0, err
    assert out.strip()
    # one document's calls follow one another: none outstanding at each pick, so the tie goes to the first
    assert served[0] > 3 and served[1] == 0


def test_close_cancels_the_requests_still_waiting(tiny_model_dir):
    with SimServer(latency=2.0).start() as a:
        backend = sim_backend([a], tiny_model_dir, max_concurrency=1)
        futures = [backend.submit(f"q{i}", SamplingParams(4)) for i in range(2)]
        time.sleep(0.2)
        t0 = time.perf_counter()
        backend.close()
        assert time.perf_counter() - t0 < 1.5 and all(f.cancelled() for f in futures)
