"""Faults of an OpenAI-compatible server on 127.0.0.1: each ends in a correct result or one clear BackendError.

The key is in the environment through every case and must appear in no message.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from memagent.backends.base import BackendError, SamplingParams
from memagent.backends.openai import OpenAIBackend

SECRET = "sk-fault-5eCr3t-never-shown"
CHAT = "/v1/chat/completions"
SRC = Path(__file__).parents[2] / "src"


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)


def make(server, tiny_model_dir, **kw):
    return OpenAIBackend(**dict(dict(model="tiny", base_url=server.url, tokenizer=tiny_model_dir, timeout=5.0,
                                     backoff=0.01, retry_seed=0, check_server=False), **kw))


def generate_in_thread(backend, limit: float):
    """(result or exception, seconds); fails the test when the call is still running after `limit` s."""
    out: dict = {}

    def call():
        t0 = time.perf_counter()
        try:
            out["value"] = backend.generate(["hello"], SamplingParams(4))
        except Exception as e:  # noqa: BLE001 - the test inspects it
            out["value"] = e
        out["seconds"] = time.perf_counter() - t0

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(limit)
    assert not t.is_alive(), f"the request was still running after {limit} s"
    return out["value"], out["seconds"]


# -- item 4: the deadline bounds the whole request ---------------------------------------------------


def test_trickling_server_is_cut_at_the_whole_request_deadline(openai_server, tiny_model_dir):
    """One byte every 0.5 s: every single read is quick, so a per-read timeout never fires."""
    b = make(openai_server, tiny_model_dir, timeout=2.0, max_retries=0)
    assert b.generate(["hello"], SamplingParams(4))[0].token_ids  # a keep-alive connection, reused below
    openai_server.trickle_next(1, 0.5)
    err, seconds = generate_in_thread(b, limit=6.0)
    assert isinstance(err, BackendError), err
    assert "no reply from" in str(err) and "within 2 s, 1 tries" in str(err)
    assert 1.9 < seconds < 3.5, seconds


def test_server_that_never_answers_is_cut_at_the_deadline(openai_server, tiny_model_dir):
    openai_server.hang_next(2)
    b = make(openai_server, tiny_model_dir, timeout=0.5, max_retries=1)
    err, seconds = generate_in_thread(b, limit=5.0)
    assert isinstance(err, BackendError) and "within 0.5 s, 2 tries" in str(err)
    assert openai_server.attempts[CHAT] == 2 and seconds < 2.5


def test_a_trickle_then_a_good_reply_is_retried_to_the_right_answer(openai_server, tiny_model_dir, tiny_backend):
    want = tiny_backend.generate(["hello"], SamplingParams(4))[0].text
    openai_server.trickle_next(1, 0.5)
    b = make(openai_server, tiny_model_dir, timeout=1.0, max_retries=1)
    gens, seconds = generate_in_thread(b, limit=6.0)
    assert gens[0].text == want and openai_server.attempts[CHAT] == 2


# -- transport faults: retried, then a correct result or a clear error --------------------------------


def test_500s_then_success_gives_the_fault_free_answer(openai_server, tiny_model_dir, tiny_backend):
    openai_server.fail_next(2, 500)
    gens = make(openai_server, tiny_model_dir, max_retries=2).generate(["hello"], SamplingParams(4))
    assert gens[0].text == tiny_backend.generate(["hello"], SamplingParams(4))[0].text
    assert openai_server.attempts[CHAT] == 3


def test_429_waits_for_retry_after(openai_server, tiny_model_dir):
    openai_server.fail_next(1, 429, retry_after=0.6)
    b = make(openai_server, tiny_model_dir, max_retries=1)  # back-off alone would be ~0.01 s
    t0 = time.perf_counter()
    assert b.generate(["hello"], SamplingParams(4))[0].token_ids
    assert time.perf_counter() - t0 >= 0.6 and openai_server.attempts[CHAT] == 2


def test_connection_closed_mid_reply(openai_server, tiny_model_dir, tiny_backend):
    openai_server.close_next(1, keep=20)
    gens = make(openai_server, tiny_model_dir, max_retries=1).generate(["hello"], SamplingParams(4))
    assert gens[0].text == tiny_backend.generate(["hello"], SamplingParams(4))[0].text
    openai_server.close_next(2, keep=20)
    with pytest.raises(BackendError, match=r"connection to .*/chat/completions broke .* 2 tries.*server's log") as e:
        make(openai_server, tiny_model_dir, max_retries=1).generate(["hello"], SamplingParams(4))
    assert SECRET not in str(e.value)


HTML = b"<html><body><h1>502 Bad Gateway</h1></body></html>"

# (name, how to inject it, what the error must say): replies whose body or fields are wrong
BAD_REPLIES = [
    ("not JSON", lambda s: s.raw_next(1, b'{"choices": [{"message": '), "not JSON"),
    ("HTML page with 200", lambda s: s.raw_next(1, HTML, content_type="text/html"), "not JSON"),
    ("HTML 502 every time", lambda s: s.raw_next(3, HTML, 502, "text/html"), "failed all 2 tries .*HTTP 502.*Bad Gateway"),
    ("body a list", lambda s: s.raw_next(1, b"[1, 2]"), "body is a list"),
    ("no choices", lambda s: s.corrupt_next(1, lambda r: dict(r, choices=[])), "no choices"),
    ("choices an object", lambda s: s.corrupt_next(1, lambda r: dict(r, choices={"0": 1})), "choices is an object"),
    ("content a list", lambda s: s.corrupt_next(1, _edit_choice(message={"content": [{"type": "text"}]})),
     r"choices\[0\]\.message\.content is a list"),
    ("message a string", lambda s: s.corrupt_next(1, _edit_choice(message="hi")), r"choices\[0\]\.message is a string"),
    ("finish_reason a number", lambda s: s.corrupt_next(1, _edit_choice(finish_reason=3)),
     r"choices\[0\]\.finish_reason is a number"),
    ("token ids strings", lambda s: s.corrupt_next(1, _edit_choice(token_ids=["1", "2"])),
     r"choices\[0\]\.token_ids is a list .*token ids"),
    ("token ids negative", lambda s: s.corrupt_next(1, _edit_choice(token_ids=[-1])), r"choices\[0\]\.token_ids"),
    ("logprobs a string", lambda s: s.corrupt_next(1, _edit_choice(logprobs="none")), r"choices\[0\]\.logprobs is a string"),
    ("logprob values strings", lambda s: s.corrupt_next(1, _edit_choice(logprobs={"content": [{"token": "a", "logprob": "x"}]})),
     r"logprobs\.content\[\]\.logprob"),
    ("usage a string", lambda s: s.corrupt_next(1, lambda r: dict(r, usage="12")), "usage is a string"),
    ("prompt_tokens a string", lambda s: s.corrupt_next(1, lambda r: dict(r, usage={"prompt_tokens": "12"})),
     r"usage\.prompt_tokens is a string"),
    ("prompt_token_ids strings", lambda s: s.corrupt_next(1, lambda r: dict(r, prompt_token_ids="1 2")),
     "prompt_token_ids is a string"),
]


def _edit_choice(**fields):
    def edit(reply):
        reply["choices"][0].update(fields)
        return reply
    return edit


@pytest.mark.parametrize("name,inject,message", BAD_REPLIES, ids=[c[0] for c in BAD_REPLIES])
def test_malformed_reply_is_a_clear_error(openai_server, tiny_model_dir, name, inject, message):
    b = make(openai_server, tiny_model_dir, max_retries=1)
    inject(openai_server)
    with pytest.raises(BackendError, match=message) as e:
        b.generate(["hello"], SamplingParams(4))
    assert openai_server.url in str(e.value) and SECRET not in str(e.value)
    assert b.generate(["hello"], SamplingParams(4))[0].token_ids  # the next reply is fine again


BAD_LISTINGS = [
    ("max_model_len a string", {"data": [{"id": "tiny", "max_model_len": "4096"}]}, r"data\[0\]\.max_model_len is a string"),
    ("max_model_len zero", {"data": [{"id": "tiny", "max_model_len": 0}]}, r"data\[0\]\.max_model_len is a number"),
    ("data an object", {"data": {"id": "tiny"}}, "data is an object"),
    ("model without id", {"data": [{"name": "tiny"}]}, r"data\[0\] is an object"),
    ("body a string", "ok", "body is a string"),
]


@pytest.mark.parametrize("name,listing,message", BAD_LISTINGS, ids=[c[0] for c in BAD_LISTINGS])
def test_malformed_model_listing_is_a_clear_error(openai_server, tiny_model_dir, name, listing, message):
    openai_server.raw_next(1, json.dumps(listing).encode())
    with pytest.raises(BackendError, match=message) as e:
        make(openai_server, tiny_model_dir, check_server=True)
    assert f"{openai_server.url}/models" in str(e.value)


@pytest.mark.slow
def test_cli_ask_against_a_trickling_server_is_one_error_line(openai_server, tiny_model_dir, tmp_path):
    """`memagent ask --request-timeout 2 --max-retries 0` ends in about 2 s with `error: ...`, exit 2."""
    doc = tmp_path / "doc.txt"
    doc.write_text("The river is long. The city is old.")
    openai_server.trickle_next(50, 0.5)
    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1", OPENAI_API_KEY=SECRET)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "memagent.cli", "ask", "--model", "tiny", "--backend", "openai",
                        "--base-url", openai_server.url, "--tokenizer", str(tiny_model_dir), "--document", str(doc),
                        "--question", "Which river?", "--request-timeout", "2", "--max-retries", "0",
                        "--no-progress"], env=env, capture_output=True, text=True, timeout=60)
    seconds = time.perf_counter() - t0
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2, p.stderr[-2000:]
    assert lines[-1].startswith("error: ") and "within 2 s" in lines[-1], p.stderr[-2000:]
    assert "Traceback" not in p.stderr and SECRET not in p.stderr + p.stdout
    # the /models check and one generation may each take their 2 s; a per-read timeout would take minutes
    assert seconds < 30, seconds
