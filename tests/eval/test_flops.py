"""The cost model against hand-worked counts and its asymptotics."""
from __future__ import annotations

import json

import pytest

from memagent.eval.flops import (
    PRESETS, CostModel, FlopsError, ModelShape, call_flops, cost_table, full_attention_flops, load_shape,
    memagent_flops, plot_cost, render_table,
)

TINY = ModelShape("tiny", layers=1, hidden=4, heads=2, kv_heads=1, intermediate=8, vocab=10)


def test_call_flops_hand_worked():
    # L = 3 tokens, 1 generated; d = 4, head_dim = 2, d_q = 4, d_kv = 2, f = 8, V = 10
    projections = 2 * 3 * 4 * (2 * 4 + 2 * 2)  # 288
    mlp = 2 * 3 * 3 * 4 * 8  # 576
    attention = 2 * 4 * 3 * 4  # causal: 2 * 2 * d_q * (1 + 2 + 3) = 96
    lm_head = 2 * 1 * 4 * 10  # 80
    assert call_flops(TINY, 3, 1) == projections + mlp + attention + lm_head == 1040
    assert call_flops(ModelShape("two", 2, 4, 2, 1, 8, 10), 3, 1) == 2 * 960 + 80  # layers scale the body


def test_memagent_is_the_papers_sum_of_calls():
    cost = CostModel(query=2, output=1, chunk=5, memory_overhead=3, final_overhead=1)
    # c = 12 -> k = ceil(12 / 5) = 3 memory calls of 2 + 3 + 5 + 1 = 11 tokens
    expected = call_flops(TINY, 6, 1) + 3 * call_flops(TINY, 11, 1) + call_flops(TINY, 4, 1)
    assert memagent_flops(TINY, 12, cost) == expected
    assert full_attention_flops(TINY, 12, cost) == call_flops(TINY, 15, 1)


def test_memagent_linear_in_chunks_and_ratio_grows():
    shape = PRESETS["qwen2.5-7b"]
    per_chunk = memagent_flops(shape, 2 * 5000) - memagent_flops(shape, 5000)
    for k in (1, 7, 100, 839):
        assert memagent_flops(shape, (k + 1) * 5000) - memagent_flops(shape, k * 5000) == per_chunk
    rows = cost_table(shape)["rows"]
    ratios = [r["ratio"] for r in rows]
    assert [r["context"] for r in rows][0] == 8192 and rows[-1]["context"] == 4 * 1024 * 1024
    assert all(b > a for a, b in zip(ratios, ratios[1:]))
    assert ratios[-1] > 10 * ratios[3]  # quadratic against linear


def test_presets_match_public_configs():
    s7, s14 = PRESETS["qwen2.5-7b"], PRESETS["qwen2.5-14b"]
    assert (s7.layers, s7.hidden, s7.heads, s7.kv_heads, s7.intermediate, s7.d_head) == (28, 3584, 28, 4, 18944, 128)
    assert (s14.layers, s14.hidden, s14.heads, s14.kv_heads, s14.intermediate, s14.d_head) == (48, 5120, 40, 8, 13824, 128)
    # parameter count check: 2 * params FLOPs per token for the matmuls (7.6B incl. embeddings)
    body = s7.layers * (s7.hidden * (2 * s7.hidden + 2 * s7.kv_heads * 128) + 3 * s7.hidden * s7.intermediate)
    assert 6.4e9 < body < 6.6e9


def test_load_shape_from_config(tmp_path):
    cfg = dict(num_hidden_layers=1, hidden_size=4, num_attention_heads=2, num_key_value_heads=1,
               intermediate_size=8, vocab_size=10)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shape = load_shape(str(tmp_path))
    assert call_flops(shape, 3, 1) == 1040
    assert load_shape("Qwen2.5-14B") == PRESETS["qwen2.5-14b"]
    with pytest.raises(FlopsError, match="give a preset"):
        load_shape("gpt-17")
    del cfg["hidden_size"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FlopsError, match="lacks 'hidden_size'"):
        load_shape(str(tmp_path))


def test_table_and_plot(tmp_path):
    from rich.console import Console

    table = cost_table(PRESETS["qwen2.5-7b"])
    console = Console(record=True, width=120)
    console.print(render_table(table))
    text = console.export_text()
    assert "FLOPs, full attention vs MemAgent (Qwen2.5-7B)" in text
    body = [line for line in text.splitlines() if line.startswith("│")]
    cells = [[c.strip() for c in line.strip("│").split("│")] for line in body]
    assert [c[0] for c in cells] == ["8K", "16K", "32K", "64K", "128K", "256K", "512K", "1M", "2M", "4M"]
    for c, row in zip(cells, table["rows"], strict=True):  # every row: chunks and ratio as computed
        assert c[1] == str(row["chunks"]) == str(-(-row["context"] // 5000))
        assert c[4] == f"{row['full_flops'] / row['memagent_flops']:.2f}x"
    # the end rows in full: FLOPs with unit prefixes (T = 1e12, P = 1e15, E = 1e18) and the paper's crossover
    assert cells[0] == ["8K", "2", "155.80T", "274.05T", "0.57x"]
    assert cells[-1] == ["4M", "839", "3.59E", "89.21P", "40.23x"]
    assert [c[4] for c in cells[2:4]] == ["0.87x", "1.16x"]  # MemAgent gets cheaper between 32K and 64K
    png = plot_cost([table, cost_table(PRESETS["qwen2.5-14b"])], tmp_path / "flops.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
