"""The shapes of decoder-only transformers (Llama / Qwen2 layout): the numbers that fix a model's FLOPs
(memagent.eval.flops, the paper's cost model) and its memory and parameter count (memagent.rl.estimate,
`memagent train --dry-run`), the known Qwen2.5 family, and the one reader of a Hugging Face config.json.

Parameters of one layer (h hidden, q = heads x head_dim, kv = kv_heads x head_dim, i the MLP width):

    attention   h q + 2 h kv + q h  (+ q + 2 kv biases, Qwen2)     q, k, v, o
    MLP         3 h i                                             gate, up: h -> i; down: i -> h
    norms       2 h                                               two RMSNorm weights

and outside the layers V h for the embeddings (2 V h with an untied head) + h for the final norm.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memagent.bounded import CONFIG_CHARS, loads_json
from memagent.errors import MemAgentError
from memagent.io import read_text

__all__ = ["KNOWN_SHAPES", "ModelShape", "ShapeError", "known_shape", "read_model_config", "shape_from_config"]


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only transformer that fix its FLOPs, memory and parameter count."""

    name: str
    layers: int  # L
    hidden: int  # d (h)
    heads: int
    kv_heads: int
    intermediate: int  # f (i), the SwiGLU width
    vocab: int  # V
    head_dim: int | None = None  # None: hidden // heads
    tied: bool = False  # the output head shares the embedding matrix
    qkv_bias: bool = True  # Qwen2 has biases on q, k, v

    @property
    def d_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def kv(self) -> int:
        """Width of k (and of v): kv_heads x head_dim."""
        return self.kv_heads * self.d_head

    @property
    def layer_params(self) -> int:
        h, q = self.hidden, self.heads * self.d_head
        attn = h * q + 2 * h * self.kv + q * h + ((q + 2 * self.kv) if self.qkv_bias else 0)
        return attn + 3 * h * self.intermediate + 2 * h  # + two RMSNorm weights

    @property
    def root_params(self) -> int:
        """Parameters outside the decoder layers: embeddings, final norm, head (unless tied)."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params


def _qwen(name: str, vocab: int, h: int, i: int, layers: int, heads: int, kv_heads: int, tied: bool) -> ModelShape:
    return ModelShape(name, layers=layers, hidden=h, heads=heads, kv_heads=kv_heads, intermediate=i, vocab=vocab,
                      tied=tied)


# Published config.json values of the Qwen2.5 family (base and Instruct share them; head_dim = hidden // heads).
KNOWN_SHAPES: dict[str, ModelShape] = {
    "qwen2.5-0.5b": _qwen("Qwen2.5-0.5B", 151936, 896, 4864, 24, 14, 2, True),
    "qwen2.5-1.5b": _qwen("Qwen2.5-1.5B", 151936, 1536, 8960, 28, 12, 2, True),
    "qwen2.5-3b": _qwen("Qwen2.5-3B", 151936, 2048, 11008, 36, 16, 2, True),
    "qwen2.5-7b": _qwen("Qwen2.5-7B", 152064, 3584, 18944, 28, 28, 4, False),
    "qwen2.5-14b": _qwen("Qwen2.5-14B", 152064, 5120, 13824, 48, 40, 8, False),
    "qwen2.5-32b": _qwen("Qwen2.5-32B", 152064, 5120, 27648, 64, 40, 8, False),
}


def known_shape(model: str) -> ModelShape | None:
    """The shape of a known model by key ("qwen2.5-7b") or Hugging Face id ("Qwen/Qwen2.5-7B-Instruct"); else None."""
    key = model.rstrip("/").split("/")[-1].lower().removesuffix("-instruct")
    return KNOWN_SHAPES.get(key)


class ShapeError(MemAgentError, ValueError):
    """A config.json that gives no usable shape; `missing` names the absent field (None: a bad value)."""

    def __init__(self, message: str, missing: str | None = None) -> None:
        super().__init__(message)
        self.missing = missing


def read_model_config(path: str | Path, error: type[MemAgentError]) -> dict[str, Any]:
    """A Hugging Face config.json (a file, or a model folder holding one) as a dict, read bounded
    (memagent.bounded); a multimodal config's `text_config` when it has one. Anything else raises `error`."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    cfg = loads_json(read_text(path, "model config", error), str(path), error, CONFIG_CHARS,
                     syntax="{where} is not valid JSON ({reason}); give a Hugging Face config.json")
    if not isinstance(cfg, dict):
        raise error(f"{path} must be a JSON object (a Hugging Face config.json)")
    text = cfg.get("text_config")
    return text if isinstance(text, dict) else cfg


_NEEDED = ("hidden_size", "num_attention_heads", "vocab_size", "intermediate_size", "num_hidden_layers")


def shape_from_config(cfg: dict[str, Any], where: str, name: str | None = None) -> ModelShape:
    """A ModelShape from a config.json's fields (`where`: the file, for messages; `name`: default its
    `_name_or_path`, else the folder's name). Every size must be a positive integer and the KV heads must
    divide the heads; ShapeError otherwise (`missing`: an absent field)."""
    for key in _NEEDED:
        if key not in cfg:
            raise ShapeError(f"{where} lacks {key!r}", missing=key)
    kv_heads = cfg.get("num_key_value_heads")
    sizes = dict(layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"], heads=cfg["num_attention_heads"],
                 kv_heads=cfg["num_attention_heads"] if kv_heads is None else kv_heads,
                 intermediate=cfg["intermediate_size"], vocab=cfg["vocab_size"], head_dim=cfg.get("head_dim"))
    for field, value in sizes.items():
        if (value is not None or field != "head_dim") and (
                isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ShapeError(f"{where}: the model's {field} must be a positive integer, got {value!r}")
    shape = ModelShape(name=name or str(cfg.get("_name_or_path") or Path(where).parent.name), **sizes,
                       tied=bool(cfg.get("tie_word_embeddings", False)),
                       qkv_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")))
    if shape.kv_heads > shape.heads or shape.heads % shape.kv_heads:  # grouped-query attention shares each KV head
        raise ShapeError(f"{where}: num_key_value_heads ({shape.kv_heads}) must divide num_attention_heads "
                         f"({shape.heads}), each KV head serving a group of query heads; fix the config")
    if shape.head_dim is None and shape.heads > shape.hidden:
        raise ShapeError(f"{where}: {shape.heads} attention heads over a hidden size of {shape.hidden} leave no "
                         "width per head; fix the config or give head_dim")
    if shape.head_dim is None and shape.hidden % shape.heads:  # hidden // heads would drop the remainder silently
        raise ShapeError(f"{where}: num_attention_heads ({shape.heads}) must divide hidden_size ({shape.hidden}), "
                         f"each head {shape.hidden / shape.heads:g} wide otherwise; fix the config or give head_dim")
    return shape
