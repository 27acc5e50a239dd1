"""Parsing OpenAI-shaped replies (hand-written JSON in the shapes vLLM and llama.cpp return)."""
from __future__ import annotations

import pytest

from memagent.backends.base import BackendError
from memagent.backends.openai import parse_choice


@pytest.fixture(scope="module")
def tok(tiny_backend):
    return tiny_backend.tokenizer


def test_vllm_return_token_ids_chat(tok):
    data = {"prompt_token_ids": [1, 2, 3], "choices": [{
        "message": {"role": "assistant", "content": "ab"}, "finish_reason": "stop", "token_ids": [10, 11, 2],
        "logprobs": {"content": [{"token": "a", "logprob": -0.5}, {"token": "b", "logprob": -1.25},
                                 {"token": "", "logprob": -0.125}]}}]}
    g, note = parse_choice(data, chat=True, tokenizer=tok, want_logprobs=True)
    assert (g.text, g.token_ids, g.logprobs, g.prompt_token_ids) == ("ab", [10, 11, 2], [-0.5, -1.25, -0.125], [1, 2, 3])
    assert g.finish_reason == "stop" and note is None


def test_tokens_as_token_ids_completions(tok):
    data = {"choices": [{"text": "xy", "finish_reason": "length", "prompt_token_ids": [7],
                         "logprobs": {"tokens": ["token_id:40", "token_id:41"], "token_logprobs": [-2.0, -3.0]}}]}
    g, note = parse_choice(data, chat=False, tokenizer=tok, want_logprobs=True)
    assert (g.token_ids, g.logprobs, g.finish_reason, g.prompt_token_ids) == ([40, 41], [-2.0, -3.0], "length", [7])
    assert note is None


def test_retokenised_ids_get_the_eos_and_matching_logprobs_are_kept(tok):
    text = "the river"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    values = [-0.1 * (i + 1) for i in range(len(ids) + 1)]  # one per token and one for the EOS
    data = {"choices": [{"message": {"content": text}, "finish_reason": "stop",
                         "logprobs": {"content": [{"token": "?", "logprob": v} for v in values]}}]}
    g, note = parse_choice(data, chat=True, tokenizer=tok, want_logprobs=True)
    assert g.token_ids == ids + [tok.eos_token_id] and g.logprobs == values and note is None
    assert g.prompt_token_ids is None  # the server did not say; the backend decides


def test_mismatched_logprobs_are_dropped_with_a_note(tok):
    data = {"choices": [{"message": {"content": "the river"}, "finish_reason": "length",
                         "logprobs": {"content": [{"token": "t", "logprob": -1.0}] * 9}}]}
    g, note = parse_choice(data, chat=True, tokenizer=tok, want_logprobs=True)
    assert g.logprobs is None and "9 log-probs" in note and "request_token_ids" in note
    assert g.token_ids == tok("the river", add_special_tokens=False)["input_ids"]  # no EOS: it hit the length
    g, note = parse_choice({"choices": [{"message": {"content": "x"}}]}, chat=True, tokenizer=tok, want_logprobs=True)
    assert g.logprobs is None and note == "the server returned no log-probs"


def test_null_content_and_missing_choices(tok):
    g, _ = parse_choice({"choices": [{"message": {"content": None}, "finish_reason": "stop"}]},
                        chat=True, tokenizer=tok, want_logprobs=False)
    assert g.text == "" and g.token_ids == [tok.eos_token_id]
    with pytest.raises(BackendError, match="no choices"):
        parse_choice({"object": "error"}, chat=True, tokenizer=tok, want_logprobs=False)
