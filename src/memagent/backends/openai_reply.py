"""Reading an OpenAI-compatible server's JSON replies, every field's type checked.

A reply is trusted for nothing: a field of an unexpected type (content a list, token ids strings,
`usage` a string, `max_model_len` a string, no choices, an error object where a completion was
expected) is a `BackendError` that names the field and the server, never a traceback further on.
Optional fields may be absent or null.
"""
from __future__ import annotations

import json
from typing import Any

from memagent.backends.base import BackendError, Generation

_TOKEN_ID_PREFIX = "token_id:"  # vLLM's return_tokens_as_token_ids spelling


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


def _bad(where: str, field: str, value: Any, expected: str) -> BackendError:
    shown = json.dumps(value, default=str)[:120]
    return BackendError(f"the server at {where} sent a reply whose {field} is {_kind(value)} ({shown}), "
                        f"expected {expected}; is it an OpenAI-compatible server (check --base-url)?")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _opt(value: Any, ok: bool, where: str, field: str, expected: str) -> Any:
    """`value` when it is null or `ok`; else the error naming `field`."""
    if value is None or ok:
        return value
    raise _bad(where, field, value, expected)


def _obj(parent: dict, key: str, where: str, field: str) -> dict:
    """parent[key] as an object ({} when absent or null)."""
    return _opt(parent.get(key), isinstance(parent.get(key), dict), where, field, "an object") or {}


def _ints(value: Any, where: str, field: str) -> list[int] | None:
    ok = isinstance(value, list) and all(_is_int(v) and v >= 0 for v in value)
    return _opt(value, ok, where, field, "a list of token ids (non-negative integers)")


def _choice(data: Any, where: str) -> dict:
    if not isinstance(data, dict):
        raise _bad(where, "body", data, "a JSON object with choices")
    choices = data.get("choices")
    if not choices:
        raise BackendError(f"the server at {where} sent a reply with no choices: {json.dumps(data, default=str)[:200]}")
    if not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise _bad(where, "choices", choices, "a list of objects")
    return choices[0]


def _logprob_fields(c: dict, chat: bool, where: str) -> tuple[list, list]:
    """(tokens, values) of the choice's log-probs, both [] when there are none."""
    lp = _obj(c, "logprobs", where, "choices[0].logprobs")
    if chat:
        entries = _opt(lp.get("content"), isinstance(lp.get("content"), list), where,
                       "choices[0].logprobs.content", "a list") or []
        if not all(isinstance(e, dict) for e in entries):
            raise _bad(where, "choices[0].logprobs.content", entries, "a list of objects")
        tokens, values = [e.get("token") for e in entries], [e.get("logprob") for e in entries]
        field = "choices[0].logprobs.content[].logprob"
    else:
        tokens = _opt(lp.get("tokens"), isinstance(lp.get("tokens"), list), where,
                      "choices[0].logprobs.tokens", "a list") or []
        values = _opt(lp.get("token_logprobs"), isinstance(lp.get("token_logprobs"), list), where,
                      "choices[0].logprobs.token_logprobs", "a list") or []
        field = "choices[0].logprobs.token_logprobs"
    if not all(v is None or _is_number(v) for v in values):
        raise _bad(where, field, values, "numbers")
    return tokens, values


def parse_choice(
    data: Any, *, chat: bool, tokenizer: Any, want_logprobs: bool, where: str = "(unknown)"
) -> tuple[Generation, str | None]:
    """One OpenAI-shaped reply (chat or completions, first choice) -> (Generation, a note when
    log-probs were asked for but cannot be used). `prompt_token_ids` is set only when the server
    returned them. where: the server's public URL, for the error messages."""
    c = _choice(data, where)
    if chat:
        message = _obj(c, "message", where, "choices[0].message")
        text = _opt(message.get("content"), isinstance(message.get("content"), str), where,
                    "choices[0].message.content", "a string") or ""
    else:
        text = _opt(c.get("text"), isinstance(c.get("text"), str), where, "choices[0].text", "a string") or ""
    reason = _opt(c.get("finish_reason"), isinstance(c.get("finish_reason"), str), where,
                  "choices[0].finish_reason", "a string")
    finish = "length" if reason == "length" else "stop"
    tokens, values = _logprob_fields(c, chat, where)

    ids = _ints(c.get("token_ids"), where, "choices[0].token_ids")  # vLLM >= 0.10.2, return_token_ids
    if ids is None and tokens and all(isinstance(t, str) and t.startswith(_TOKEN_ID_PREFIX) for t in tokens):
        spelt = [t[len(_TOKEN_ID_PREFIX):] for t in tokens]  # vLLM, return_tokens_as_token_ids
        if not all(s.isdigit() for s in spelt):
            raise _bad(where, "choices[0].logprobs tokens", tokens, '"token_id:N" with N an integer')
        ids = [int(s) for s in spelt]
    exact = ids is not None
    if ids is None:  # re-tokenise; the EOS the server stopped on is not in the text
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if finish == "stop" and tokenizer.eos_token_id is not None:
            ids = ids + [tokenizer.eos_token_id]
    ids = [int(i) for i in ids]  # [T_out]

    logprobs, note = None, None
    if want_logprobs:
        if not values or any(v is None for v in values):
            note = "the server returned no log-probs"
        elif len(values) != len(ids):
            note = (f"the server returned {len(values)} log-probs for {len(ids)} "
                    f"{'token ids' if exact else 're-tokenised ids'}; they were dropped "
                    "(with vLLM, pass request_token_ids=True for exact ids)")
        else:
            logprobs = [float(v) for v in values]  # [T_out]
    top = data.get("prompt_token_ids")
    prompt_ids = _ints(top, where, "prompt_token_ids") if top is not None else \
        _ints(c.get("prompt_token_ids"), where, "choices[0].prompt_token_ids")
    return Generation(text=text, token_ids=ids, logprobs=logprobs, prompt_token_ids=prompt_ids or None,
                      finish_reason=finish), note


def prompt_tokens(data: dict, where: str) -> int | None:
    """usage.prompt_tokens of a reply, when the server counted it."""
    usage = _obj(data, "usage", where, "usage")
    return _opt(usage.get("prompt_tokens"), _is_int(usage.get("prompt_tokens")), where, "usage.prompt_tokens",
                "an integer")


def served_models(listing: Any, where: str) -> list[dict]:
    """The model entries of a GET /models reply ({"data": [{"id": ..., "max_model_len": ...}, ...]})."""
    if not isinstance(listing, dict):
        raise _bad(where, "body", listing, 'a JSON object {"data": [models]}')
    data = _opt(listing.get("data"), isinstance(listing.get("data"), list), where, "data", "a list of models") or []
    for n, m in enumerate(data):
        if not isinstance(m, dict) or not isinstance(m.get("id"), str):
            raise _bad(where, f"data[{n}]", m, 'a model object with a string "id"')
        window = m.get("max_model_len")
        _opt(window, _is_int(window) and window > 0, where, f"data[{n}].max_model_len", "a positive integer")
    return data
