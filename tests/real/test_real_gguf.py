"""The packaged GGUF file converted to a model folder: what the folder holds, that `--model FILE.gguf` finds the
cached conversion, and that the converted model computes what transformers' own GGUF loading computes."""
from __future__ import annotations

import json

import pytest
import torch

from real_model import MODEL_WINDOW, require_real_gguf

pytestmark = pytest.mark.slow


def test_the_folder_holds_config_tokenizer_and_template(real_model_dir):
    from transformers import AutoConfig, AutoTokenizer

    from memagent.backends.gguf import file_sha256

    config = AutoConfig.from_pretrained(real_model_dir)
    assert config.model_type == "llama" and config.max_position_embeddings == MODEL_WINDOW
    assert "quantization_config" not in config.to_dict()
    tok = AutoTokenizer.from_pretrained(real_model_dir)
    assert len(tok) == 49152 and tok.eos_token == "<|im_end|>" and tok.model_max_length == MODEL_WINDOW
    assert (real_model_dir / "chat_template.jinja").is_file()
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    record = json.loads((real_model_dir / "memagent-import.json").read_text())
    assert record["sha256"] == file_sha256(require_real_gguf()) and record["context_length"] == MODEL_WINDOW


def test_a_gguf_file_as_model_is_its_cached_folder(real_model_dir, monkeypatch):
    from memagent.backends.gguf import resolve_model

    monkeypatch.setenv("MEMAGENT_CACHE", str(real_model_dir.parents[1]))  # the fixture's cache root
    assert resolve_model(str(require_real_gguf())) == str(real_model_dir)


def test_the_converted_weights_compute_what_transformers_gguf_loading_computes(real_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = require_real_gguf()
    direct = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    converted = AutoModelForCausalLM.from_pretrained(real_model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(real_model_dir)
    ids = tok("The river Avon flows past 42 old mills.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.equal(direct(ids).logits, converted(ids).logits)
