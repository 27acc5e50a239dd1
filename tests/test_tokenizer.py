"""The one tokenizer loader, the one pad-token fix, the one chat renderer (memagent.backends.tokenizer / .chat)."""
from __future__ import annotations

import pytest

from memagent.backends.base import BackendError
from memagent.backends.chat import render_prompt
from memagent.backends.hf import TransformersBackend
from memagent.backends.tokenizer import ensure_pad_token, load_tokenizer


def test_an_object_is_returned_as_is_and_tasks_use_the_same_loader():
    from memagent.tasks import schema

    marker = object()
    assert load_tokenizer(marker, "some-model") is marker
    assert schema.load_tokenizer is load_tokenizer


def test_tiny_is_the_built_in_tokenizer_unless_a_directory_has_that_name(tmp_path, monkeypatch, tiny_tokenizer):
    built = object()
    monkeypatch.setattr("memagent.backends.tiny.build_tokenizer", lambda: built)
    monkeypatch.chdir(tmp_path)
    assert load_tokenizer("tiny") is built
    assert load_tokenizer(None, "tiny") is built  # the model's name, when no tokenizer is named
    tiny_tokenizer.save_pretrained(tmp_path / "tiny")
    loaded = load_tokenizer("tiny")
    assert loaded is not built and loaded.name_or_path == "tiny"
    assert loaded("a river")["input_ids"] == tiny_tokenizer("a river")["input_ids"]


def test_a_missing_tokenizer_is_one_clear_error(tmp_path):
    with pytest.raises(BackendError, match=r"(?s)cannot load the tokenizer '.*nothing': .*local directory"):
        load_tokenizer(str(tmp_path / "nothing"))
    with pytest.raises(BackendError, match=r"(?s)model name was tried.*--tokenizer"):
        load_tokenizer(None, str(tmp_path / "nothing"))
    with pytest.raises(BackendError, match="no tokenizer"):
        load_tokenizer(None)


class _Tok:
    """A tokenizer's pad attributes: pad_token_id follows pad_token."""

    eos_token = "<eos>"

    def __init__(self, pad_token):
        self.pad_token = pad_token

    @property
    def pad_token_id(self):
        return None if self.pad_token is None else {"<eos>": 2, "<pad>": 0}[self.pad_token]


def test_ensure_pad_token_sets_eos_only_when_there_is_no_pad():
    tok = _Tok(None)
    assert ensure_pad_token(tok) is tok and tok.pad_token == "<eos>" and tok.pad_token_id == 2
    kept = _Tok("<pad>")
    assert ensure_pad_token(kept).pad_token == "<pad>" and kept.pad_token_id == 0


def test_the_transformers_backend_renders_through_render_prompt(tiny_backend):
    # the tiny tokenizer's ChatML template (memagent.backends.tiny.CHATML_TEMPLATE), worked by hand
    expected = "<|im_start|>user\nWhich river?<|im_end|>\n<|im_start|>assistant\n"
    assert tiny_backend.render("Which river?") == expected
    assert render_prompt(tiny_backend.tokenizer, "Which river?", True) == expected
    assert render_prompt(tiny_backend.tokenizer, "Which river?", False) == "Which river?"
    with pytest.raises(BackendError, match="'auto', True or False"):
        TransformersBackend(tiny_backend.model, tiny_backend.tokenizer, use_chat_template="yes")


def test_middle_truncate_has_one_home():
    from memagent.agent import chunking
    from memagent.eval import baselines

    assert baselines.middle_truncate is chunking.middle_truncate and baselines.Prepared is chunking.Prepared
