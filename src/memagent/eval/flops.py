"""The paper's cost model: FLOPs of full attention against MemAgent, 8K to 4M tokens.

Accounting (docs/paper.md, "Cost model"), with q = 1024 query tokens, o = 1024 output tokens,
N = 5000 chunk tokens and a context of c tokens:

    full attention   one call of q + c + o tokens
    MemAgent         one initial call of q + 200 + o tokens,
                     k = ceil(c / N) memory calls of q + 200 + N + o tokens each,
                     one final call of q + 100 + o tokens

A call of L tokens (of which `o` are generated) costs one causal forward pass over L tokens
(a KV-cached decode does the same arithmetic as a prefill of the whole sequence):

    per layer   projections  2 L d (2 d_q + 2 d_kv)          q, k, v, o
                MLP          2 L (3 d f)                      SwiGLU: gate, up, down
                attention    2 d_q L (L + 1)                  QK^T and AV, causal: sum_i 2 * 2 d_q i
    once        LM head      2 o d V                          logits of the generated tokens only

where d is the hidden size, d_q = heads * head_dim, d_kv = kv_heads * head_dim, f the MLP width,
V the vocabulary. Norms, rotary embeddings, softmax and residual adds (O(L d)) are left out, as
usual. The paper gives FLOPs only; so does this module (`memagent.eval.timing` measures time).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from rich.console import Group
from rich.table import Table

from memagent.config import AgentConfig
from memagent.errors import MemAgentError
from memagent.io import atomic_write
from memagent.model_shapes import KNOWN_SHAPES, ModelShape, ShapeError, read_model_config, shape_from_config

__all__ = [
    "PRESETS",
    "CostModel",
    "ModelShape",
    "call_flops",
    "cost_table",
    "flops_report",
    "full_attention_flops",
    "load_shape",
    "memagent_flops",
    "plot_cost",
    "render_table",
]


# From the public config.json of Qwen/Qwen2.5-7B-Instruct and Qwen/Qwen2.5-14B-Instruct (memagent.model_shapes).
PRESETS = {key: KNOWN_SHAPES[key] for key in ("qwen2.5-7b", "qwen2.5-14b")}
SHAPE_KEYS = ("name", "layers", "hidden", "heads", "kv_heads", "intermediate", "vocab", "head_dim")  # of the JSON


@dataclass(frozen=True)
class CostModel:
    """The paper's token budget for each call."""

    query: int = AgentConfig.query_tokens  # q
    output: int = AgentConfig.memory_tokens  # o: the memory cap M (the answer budget is the same)
    chunk: int = AgentConfig.chunk_tokens  # N
    memory_overhead: int = 200  # template tokens of the initial and memory calls
    final_overhead: int = 100  # template tokens of the final call


class FlopsError(MemAgentError, ValueError):
    """A model shape or config cannot be used for the cost model."""


def load_shape(name_or_path: str) -> ModelShape:
    """A preset name, or a Hugging Face config.json (a file or a model directory holding one)."""
    key = name_or_path.lower()
    if key in PRESETS:
        return PRESETS[key]
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise FlopsError(f"unknown model {name_or_path!r}: give a preset ({', '.join(PRESETS)}) "
                         "or a config.json / model directory")
    try:
        return shape_from_config(read_model_config(path, FlopsError), str(path))
    except ShapeError as exc:
        if exc.missing is None:
            raise FlopsError(str(exc)) from None
        raise FlopsError(f"{path} lacks {exc.missing!r}; a decoder config with layers, sizes and heads is needed") \
            from None


def call_flops(shape: ModelShape, tokens: int, output: int) -> int:
    """FLOPs of one call of `tokens` tokens in all, the last `output` of them generated."""
    d, dq, dkv = shape.hidden, shape.heads * shape.d_head, shape.kv_heads * shape.d_head
    per_layer = (
        2 * tokens * d * (2 * dq + 2 * dkv)  # (L, d) @ (d, d_q | d_kv | d_kv), (L, d_q) @ (d_q, d)
        + 2 * tokens * 3 * d * shape.intermediate  # gate, up: (L, d) @ (d, f); down: (L, f) @ (f, d)
        + 2 * dq * tokens * (tokens + 1)  # causal QK^T and AV over all heads
    )
    return shape.layers * per_layer + 2 * output * d * shape.vocab


def full_attention_flops(shape: ModelShape, context: int, cost: CostModel = CostModel()) -> int:
    """One call over the question, the whole context and the answer."""
    return call_flops(shape, cost.query + context + cost.output, cost.output)


def num_chunks(context: int, cost: CostModel = CostModel()) -> int:
    return math.ceil(context / cost.chunk)


def memagent_flops(shape: ModelShape, context: int, cost: CostModel = CostModel()) -> int:
    """Initial call + ceil(c / N) memory calls + final call (the paper's accounting)."""
    q, o = cost.query, cost.output
    initial = call_flops(shape, q + cost.memory_overhead + o, o)
    memory = call_flops(shape, q + cost.memory_overhead + cost.chunk + o, o)
    final = call_flops(shape, q + cost.final_overhead + o, o)
    return initial + num_chunks(context, cost) * memory + final


DEFAULT_LENGTHS = tuple(8192 * 2**i for i in range(10))  # 8K ... 4M


def cost_table(shape: ModelShape, lengths: Sequence[int] = DEFAULT_LENGTHS, cost: CostModel = CostModel()) -> dict[str, Any]:
    """The comparison as a JSON-ready dict: model, budget, and one row per context length."""
    rows = []
    for c in lengths:
        full, mem = full_attention_flops(shape, c, cost), memagent_flops(shape, c, cost)
        rows.append(dict(context=c, chunks=num_chunks(c, cost), full_flops=full, memagent_flops=mem,
                         ratio=full / mem))
    return dict(model={k: getattr(shape, k) for k in SHAPE_KEYS}, cost=asdict(cost), rows=rows)


def _human(n: float) -> str:
    for unit, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.3g}"


def _tokens(n: int) -> str:
    return f"{n // 1048576}M" if n % 1048576 == 0 else f"{n // 1024}K" if n % 1024 == 0 else str(n)


def render_table(table: dict[str, Any]) -> Any:
    """A rich Table of the comparison."""
    t = Table(title=f"FLOPs, full attention vs MemAgent ({table['model']['name']})")
    for col in ("context", "chunks", "full attention", "MemAgent", "full / MemAgent"):
        t.add_column(col, justify="right")
    for r in table["rows"]:
        t.add_row(_tokens(r["context"]), str(r["chunks"]), _human(r["full_flops"]), _human(r["memagent_flops"]),
                  f"{r['ratio']:.2f}x")
    return t


def plot_cost(tables: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Log-log PNG of FLOPs against context length, one pair of lines per model."""
    import matplotlib  # lazy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for table in tables:
        xs = [r["context"] for r in table["rows"]]
        name = table["model"]["name"]
        ax.plot(xs, [r["full_flops"] for r in table["rows"]], marker="o", label=f"{name} full attention")
        ax.plot(xs, [r["memagent_flops"] for r in table["rows"]], marker="s", label=f"{name} MemAgent")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(xs, [_tokens(x) for x in xs])
    ax.set_xlabel("context tokens")
    ax.set_ylabel("FLOPs")
    ax.set_title("Cost of reading a context: O(n^2) full attention vs O(n) MemAgent")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    with atomic_write(path, "wb") as fh:  # a temp file renamed over `path`: a failed write leaves no half PNG
        fig.savefig(fh, dpi=120, format=path.suffix.lstrip(".").lower() or "png")
    plt.close(fig)
    return path


def flops_report(models: Sequence[str], lengths: Sequence[int] = DEFAULT_LENGTHS, as_json: bool = False,
                 plot: str | Path | None = None) -> str | Any:
    """`memagent flops`: the JSON text (as_json) or a rich table per model; writes the PNG when asked."""
    tables = [cost_table(load_shape(m), lengths) for m in models]
    if plot is not None:
        plot_cost(tables, plot)
    if as_json:
        return json.dumps(tables[0] if len(tables) == 1 else tables, indent=2)
    return Group(*(render_table(t) for t in tables))
