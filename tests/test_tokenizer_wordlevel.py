"""The tokenizer check accepts a word-level tokenizer with an unknown token (the demo's toy tokenizer maps the
probe sentence's words to it) when its own words round-trip; the quick demo's model failed `memagent ask`
without this."""
from __future__ import annotations

import pytest

from memagent.backends.base import BackendError
from memagent.backends.tokenizer import check_tokenizer
from memagent.demo.config import DemoConfig
from memagent.tasks.toy import build_toy_tokenizer


def test_the_toy_tokenizer_passes_and_its_probe_is_all_unknown():
    tok = build_toy_tokenizer(DemoConfig().spec)
    ids = tok("The river Avon flows past 42 old mills.", add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id in ids  # the plain probe alone would refuse it
    assert check_tokenizer(tok, "toy") is tok


def test_a_word_level_tokenizer_whose_words_do_not_come_back_is_refused(monkeypatch):
    tok = build_toy_tokenizer(DemoConfig().spec)
    monkeypatch.setattr(type(tok), "decode", lambda self, ids, **kw: "")
    with pytest.raises(BackendError, match="does not decode what it encodes"):
        check_tokenizer(tok, "toy")
