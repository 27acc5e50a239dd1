"""The `openai` backend against a real HTTP server on loopback serving the tiny model."""
from __future__ import annotations

import time

import pytest

from memagent.agent.workflow import AgentInput, MemoryAgent
from memagent.backends import load_backend
from memagent.backends.base import BackendError, SamplingParams
from memagent.backends.hf import TransformersBackend
from memagent.backends.openai import OpenAIBackend, backoff_delay, public_url
from memagent.config import AgentConfig

PROMPTS = ["hello world", "the answer is", "Document 1:\nRiver\nThe river is long."]
SECRET = "sk-test-5eCr3t-do-not-print"
CHAT = "/v1/chat/completions"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


def make(server_or_url, tiny_model_dir, **kw):
    url = server_or_url if isinstance(server_or_url, str) else server_or_url.url
    kw = dict(dict(model="tiny", base_url=url, tokenizer=tiny_model_dir, timeout=5.0, backoff=0.01,
                   retry_seed=0), **kw)
    return OpenAIBackend(**kw)


def direct(backend: TransformersBackend, prompt: str, params: SamplingParams, index: int = 0):
    """What the server computes for request `index` of a batch: one prompt, seed + index."""
    seed = None if params.seed is None else params.seed + index
    return backend.generate([prompt], SamplingParams(params.max_new_tokens, params.temperature, params.top_p, seed))[0]


def test_greedy_text_equals_transformers(openai_server, tiny_model_dir, tiny_backend):
    b = make(openai_server, tiny_model_dir)
    params = SamplingParams(12)
    gens = b.generate(PROMPTS, params)
    for i, (p, g) in enumerate(zip(PROMPTS, gens)):
        ref = direct(tiny_backend, p, params)
        assert g.text == ref.text and g.finish_reason == ref.finish_reason
        assert g.prompt_token_ids == ref.prompt_token_ids  # local rendering, confirmed by usage
        assert b.prompt_length(p) == tiny_backend.prompt_length(p)
    # requests run concurrently, so they may arrive in any order: find the first prompt's body
    [body] = [b for b in openai_server.bodies if b["messages"][0]["content"] == PROMPTS[0]]
    assert body["messages"] == [{"role": "user", "content": PROMPTS[0]}]
    assert body["temperature"] == 0.0 and body["max_tokens"] == 12 and "seed" not in body


def test_seeded_sampling_exact_ids_and_logprobs(openai_server, tiny_model_dir, tiny_backend):
    b = make(openai_server, tiny_model_dir, want_logprobs=True, request_token_ids=True)
    params = SamplingParams(16, temperature=1.0, seed=7)
    gens = b.generate(PROMPTS, params)
    scorer = TransformersBackend(tiny_backend.model, tiny_backend.tokenizer, want_logprobs=True)
    assert len({g.text for g in gens}) == 3  # sampled replies differ: the order check below means something
    for i, (p, g) in enumerate(zip(PROMPTS, gens)):
        ref = direct(scorer, p, params, index=i)
        assert g.text == ref.text
        assert g.token_ids == ref.token_ids and g.prompt_token_ids == ref.prompt_token_ids
        assert g.logprobs == pytest.approx(ref.logprobs, abs=1e-5)
    assert sorted(body["seed"] for body in openai_server.bodies) == [7, 8, 9]  # arrival order varies
    assert all(body["return_token_ids"] and body["return_tokens_as_token_ids"] for body in openai_server.bodies)


def test_completions_endpoint_sends_raw_text(openai_server, tiny_model_dir, tiny_backend):
    b = make(openai_server, tiny_model_dir, use_chat=False)
    raw = TransformersBackend(tiny_backend.model, tiny_backend.tokenizer, use_chat_template=False)
    params = SamplingParams(10, temperature=1.0, seed=3)
    for i, (p, g) in enumerate(zip(PROMPTS, b.generate(PROMPTS, params))):
        assert g.text == direct(raw, p, params, index=i).text
    assert openai_server.attempts["/v1/completions"] == 3
    assert sorted(body["prompt"] for body in openai_server.bodies) == sorted(PROMPTS)  # concurrent: any arrival order
    assert b.prompt_length(PROMPTS[0]) == raw.prompt_length(PROMPTS[0])


def test_memory_agent_through_openai_equals_direct(openai_server, tiny_model_dir, tiny_backend):
    cfg = AgentConfig(chunk_tokens=48, memory_tokens=12, answer_tokens=12, query_tokens=32,
                      temperature=1.0, seed=5)
    doc = " ".join(f"Document {i}: the river number {i * 37} flows past the city." for i in range(20))
    item = [AgentInput("Which river is longest?", doc, "d0")]
    got = MemoryAgent(make(openai_server, tiny_model_dir), cfg, keep_conversations=True).run(item)[0]
    ref = MemoryAgent(tiny_backend, cfg, keep_conversations=True).run(item)[0]
    assert got.num_chunks == ref.num_chunks > 3
    assert [c.text for c in got.conversations] == [c.text for c in ref.conversations]
    assert (got.answer, got.raw_answer, got.memory) == (ref.answer, ref.raw_answer, ref.memory)
    assert openai_server.attempts[CHAT] == got.num_chunks + 1


def test_max_window_from_server_then_config(openai_server, tiny_model_dir):
    assert make(openai_server, tiny_model_dir).max_window == 4096  # the server's max_model_len
    assert make(openai_server, tiny_model_dir, check_server=False).max_window == 16384  # config.json
    assert make(openai_server, tiny_model_dir, max_window=999).max_window == 999


def test_500s_are_retried_then_succeed(openai_server, tiny_model_dir):
    b = make(openai_server, tiny_model_dir, max_retries=3)
    openai_server.fail_next(2, 500)
    assert b.generate(["hello"], SamplingParams(4))[0].token_ids
    assert openai_server.attempts[CHAT] == 3


def test_429_is_retried_and_400_is_not(openai_server, tiny_model_dir):
    b = make(openai_server, tiny_model_dir, max_retries=3)
    openai_server.fail_next(1, 429)
    b.generate(["hello"], SamplingParams(4))
    assert openai_server.attempts[CHAT] == 2
    openai_server.fail_next(1, 400)
    with pytest.raises(BackendError, match=r"HTTP 400.*not retried"):
        b.generate(["hello"], SamplingParams(4))
    assert openai_server.attempts[CHAT] == 3


def test_persistent_500_gives_a_clear_error(openai_server, tiny_model_dir):
    b = make(openai_server, tiny_model_dir, max_retries=2)
    openai_server.fail_next(10, 503)
    with pytest.raises(BackendError) as e:
        b.generate(["hello"], SamplingParams(4))
    msg = str(e.value)
    assert "HTTP 503" in msg and "3 tries" in msg and f"{openai_server.url}/chat/completions" in msg
    assert "server's log" in msg
    assert openai_server.attempts[CHAT] == 3


def test_slow_reply_times_out_and_is_retried(openai_server, tiny_model_dir):
    b = make(openai_server, tiny_model_dir, timeout=0.3, max_retries=1)
    openai_server.slow_next(1, 3.0)
    t0 = time.perf_counter()
    assert b.generate(["hello"], SamplingParams(4))[0].token_ids
    assert time.perf_counter() - t0 < 2.0 and openai_server.attempts[CHAT] == 2


def test_persistent_slow_reply_gives_timeout_error(openai_server, tiny_model_dir):
    b = make(openai_server, tiny_model_dir, timeout=0.2, max_retries=1)
    openai_server.slow_next(5, 3.0)
    with pytest.raises(BackendError, match=r"no reply from .* within 0.2 s, 2 tries"):
        b.generate(["hello"], SamplingParams(4))
    assert openai_server.attempts[CHAT] == 2


def test_refused_connection_says_unreachable(refused_url, tiny_model_dir):
    with pytest.raises(BackendError, match=r"is unreachable after 2 tries.*--base-url"):
        make(refused_url, tiny_model_dir, max_retries=1)  # the /models check at construction
    b = make(refused_url, tiny_model_dir, max_retries=0, check_server=False)
    with pytest.raises(BackendError, match=r"unreachable after 1 tries"):
        b.generate(["hello"], SamplingParams(4))


def test_api_key_is_sent_but_never_shown(openai_server, tiny_model_dir, refused_url, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    openai_server.api_key = SECRET
    b = make(openai_server, tiny_model_dir, max_retries=1)
    b.generate(["hello"], SamplingParams(4))
    assert openai_server.auth_headers[-1] == f"Bearer {SECRET}"
    assert SECRET not in repr(b) and SECRET not in str(b) and "$OPENAI_API_KEY" in repr(b)
    assert SECRET not in repr(vars(b)) and SECRET not in repr(vars(b._http))  # the key lives in the SDK client only
    messages = []
    openai_server.api_key = "another-key"  # the server now refuses ours, and echoes it back
    with pytest.raises(BackendError) as e:
        b.generate(["hello"], SamplingParams(4))
    messages.append(str(e.value))
    assert "HTTP 401" in messages[-1] and "OPENAI_API_KEY" in messages[-1] and "***" in messages[-1]
    openai_server.api_key = SECRET
    openai_server.fail_next(5, 500)
    with pytest.raises(BackendError) as e:
        b.generate(["hello"], SamplingParams(4))
    messages.append(str(e.value))
    with pytest.raises(BackendError) as e:
        make(refused_url.replace("http://", "http://user:pw-secret@") + "?key=q-secret", tiny_model_dir, max_retries=0)
    messages.append(str(e.value))
    for m in messages:
        assert SECRET not in m and "pw-secret" not in m and "q-secret" not in m


def test_concurrency_limit_is_respected_and_order_kept(openai_server, tiny_model_dir, tiny_backend):
    b = make(openai_server, tiny_model_dir, max_concurrency=3)
    openai_server.latency = 0.1  # requests overlap, so the limit is what bounds them
    prompts = [f"question number {i}" for i in range(9)]
    params = SamplingParams(6, temperature=1.0, seed=11)
    gens = b.generate(prompts, params)
    assert openai_server.max_in_flight == 3
    assert [g.text for g in gens] == [direct(tiny_backend, p, params, i).text for i, p in enumerate(prompts)]


def test_first_failure_cancels_the_rest(openai_server, tiny_model_dir):
    b = make(openai_server, tiny_model_dir, max_concurrency=1, max_retries=0)
    openai_server.fail_next(1, 500)
    with pytest.raises(BackendError, match="HTTP 500"):
        b.generate(PROMPTS, SamplingParams(4))
    assert openai_server.attempts[CHAT] == 1  # the queued requests were never sent


def test_wrong_model_url_and_tokenizer_are_clear(openai_server, tiny_model_dir, tmp_path, monkeypatch):
    with pytest.raises(BackendError, match=r"does not serve model 'other'; it serves: tiny"):
        make(openai_server, tiny_model_dir, model="other")
    with pytest.raises(BackendError, match=r"needs the server's URL.*OPENAI_BASE_URL"):
        OpenAIBackend("tiny", tokenizer=tiny_model_dir)
    with pytest.raises(BackendError, match=r"not an http\(s\) URL"):
        OpenAIBackend("tiny", base_url="localhost:8000", tokenizer=tiny_model_dir)
    with pytest.raises(BackendError, match=r"(?s)the tokenizer .*model name was tried.*has no vocabulary file.*--tokenizer"):
        OpenAIBackend(str(tmp_path), base_url=openai_server.url)
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.url)
    assert load_backend("openai", "tiny", tokenizer=str(tiny_model_dir)).base_url == openai_server.url


def test_tokenizer_defaults_to_the_model_name(tiny_backend, tiny_model_dir):
    from fake_openai_server import FakeOpenAIServer

    server = FakeOpenAIServer(tiny_backend, model_names=(str(tiny_model_dir),)).start()
    try:
        b = OpenAIBackend(str(tiny_model_dir), base_url=server.url)
        assert b.tokenizer.eos_token == "<|im_end|>"
        assert b.generate(["hi"], SamplingParams(3))[0].text == tiny_backend.generate(["hi"], SamplingParams(3))[0].text
    finally:
        server.stop()


def test_backoff_and_public_url():
    assert [backoff_delay(k, 1.0, 30.0, 0.5) for k in (1, 2, 3, 6)] == [1.0, 2.0, 4.0, 30.0]
    assert backoff_delay(1, 1.0, 30.0, 0.0) == 0.5 and backoff_delay(2, 1.0, 30.0, 0.999) == pytest.approx(2.998)
    assert public_url("https://u:p@host:8443/v1?api-key=s") == "https://host:8443/v1"
