"""A tiny embedded model for laptops and tests: a small Qwen2 config and a byte-level BPE
tokenizer trained locally, saved with `save_pretrained` (safetensors) so that it loads through
exactly the same code path as a real model (`AutoModelForCausalLM.from_pretrained(dir)`).

The tokenizer is byte-level: it encodes ANY UTF-8 text (unknown characters fall back to bytes).
Its merges are trained on a built-in, deterministic corpus (the prompt templates and a small
English word list), so the same code always builds the same tokenizer.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Iterable

from memagent.config import PAPER_FINAL_TEMPLATE, PAPER_MEMORY_TEMPLATE
from memagent.io import staged_dir

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_WORDS = (
    "the of and to in is was for on that with as by at from his her it an were are which this be "
    "has had he she they their not or its first one new who after also been but two year years "
    "city film world time state known united american born school new national team war game "
    "season may used would him more other when between during most only into three made such "
    "some over where under there about then these both since many later name part where what "
    "which who whom how much answer question problem memory section document article updated "
    "previous information value key fact number river country music album song band series "
    "university company people family village county located released written directed founded"
).split()


def _corpus(extra_words: Iterable[str], seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = list(_WORDS) + list(extra_words)
    lines = [PAPER_MEMORY_TEMPLATE, PAPER_FINAL_TEMPLATE] * 20
    lines += [" ".join(rng.choice(words) for _ in range(12)) + "." for _ in range(2000)]
    lines += [" ".join(str(rng.randint(0, 9999)) for _ in range(8)) for _ in range(200)]
    lines += [" ".join(extra_words)] * 50 if extra_words else []
    return lines


def build_tokenizer(vocab_size: int = 2048, extra_words: Iterable[str] = ()) -> Any:
    """A byte-level BPE tokenizer of the Qwen2 kind (`Qwen2Tokenizer`), with a ChatML template.

    It uses Qwen2's normaliser (NFC) and pre-tokeniser (its split regex, then byte-level), so a
    model directory saved with it loads back through `AutoTokenizer` as the same tokenizer.
    extra_words: words that should become single tokens (e.g. a toy task's vocabulary); they are
    added to the training corpus, so with a large enough `vocab_size` each gets its own merges.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # lazy: tokenizers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer  # lazy: transformers

    extra_words = list(extra_words)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(extra_words), trainer)
    vocab = tok.get_vocab()
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in _merges(tok)]
    fast = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, eos_token="<|im_end|>",
                          pad_token="<|endoftext|>", additional_special_tokens=["<|im_start|>"])
    fast.chat_template = CHATML_TEMPLATE
    return fast


def _merges(tok: Any) -> list[Any]:
    return json.loads(tok.to_str())["model"]["merges"]


def tiny_config(vocab_size: int, **overrides: Any) -> Any:
    """A Qwen2 config small enough for 2 CPU cores (about 0.2M parameters with the default tokenizer)."""
    from transformers import Qwen2Config  # lazy: transformers

    kw: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16384,  # fits the paper's default 8K budget (1024 + 5000 + 1024 + 1024)
        rope_theta=10000.0,
        tie_word_embeddings=True,
        initializer_range=0.2,  # large enough that random weights write varied text, not one repeated token
    )
    kw.update(overrides)
    return Qwen2Config(**kw)


def build_tiny_model(out_dir: str | Path, seed: int = 0, tokenizer: Any = None, **config_overrides: Any) -> Path:
    """Write a randomly initialised tiny model and its tokenizer to `out_dir` (safetensors)."""
    import torch  # lazy: torch
    from transformers import AutoModelForCausalLM  # lazy: transformers

    out = Path(out_dir)
    tokenizer = tokenizer if tokenizer is not None else build_tokenizer()
    cfg = tiny_config(len(tokenizer), **config_overrides)
    cfg.eos_token_id = tokenizer.eos_token_id
    cfg.pad_token_id = tokenizer.pad_token_id
    cfg.bos_token_id = None
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.pad_token_id]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    with staged_dir(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return out


