"""`memagent train --dry-run`: the per-GPU memory estimate and steps per epoch, checked against hand arithmetic."""
import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch

from memagent.config import ConfigError
from memagent.rl.config import load_config
from memagent.rl.estimate import (KNOWN_SHAPES, activation_bytes, dry_run_report, estimate_for, model_shape,
                                  shape_from_config)

ROOT = Path(__file__).resolve().parents[2]
CFG_7B = ROOT / "configs" / "rl" / "qwen2.5-7b-8gpu.yaml"


def test_dry_run_7b_within_15_percent_of_hand_figure(run_cli):
    # Qwen2.5-7B: vocab V = 152064, h = 3584, MLP i = 18944, 28 layers, k/v width 4 x 128 = 512, untied head.
    #   embeddings + head: 2 x 152064 x 3584                   = 1.090e9
    #   one layer: q, o 2 x 3584^2 = 25.69e6; k, v 2 x 3584 x 512 = 3.67e6; MLP 3 x 3584 x 18944 = 203.69e6
    #              -> 233.4e6; x 28                          = 6.535e9
    #   P ~ 7.62e9 parameters, bf16 (2 bytes), FSDP2 over 8 GPUs:
    #   weights 7.62e9 x 2 / 8 = 1.90 GB; gradients 1.90; AdamW m + v 3.81; frozen reference 1.90   -> 9.52 GB
    #   unsharded copy that generates the rollouts: 7.62e9 x 2                                     -> 15.24 GB
    #   FSDP all-gathered: embeddings + head 2.18 GB + 3 layers x 233.4e6 x 2 = 1.40 GB            -> 3.58 GB
    #   activations, checkpointing on, 16384 tokens: layer inputs 16384 x 28 x 3584 x 2 = 3.29 GB,
    #       one layer recomputed 16384 x (6 x 3584 + 2 x 512 + 4 x 18944) x 2 = 3.22 GB          -> 6.51 GB
    #   logits: 2 rows x 1024 response tokens x 152064 x (2 + 4 + 4) bytes                         -> 3.11 GB
    hand = 9.52 + 15.24 + 3.58 + 6.51 + 3.11  # = 37.96 GB
    code, out, err = run_cli("train", CFG_7B, "--dry-run", "--gpus", "8", "--samples", "1000")
    assert code == 0, err
    got = float(re.search(r"estimate: ([\d.]+) GB per GPU", out).group(1))
    print(out)
    assert abs(got - hand) / hand <= 0.15, (got, hand)
    # checkpointing off: activations 16384 x 28 x 196608 B = 90.2 GB instead of 6.51 (the table's first column)
    off = float(re.search(r"^total\s+([\d.]+)\s+([\d.]+)", out, re.M).group(1))
    assert abs(off - (hand - 6.51 + 90.19)) / off <= 0.15
    # 1000 samples / 128 questions per step = 7.81 steps; x 16 mini-batches = 125 optimiser steps
    assert "1000 samples / rollout.batch_size 128 = 7.81 (125 optimiser steps)" in out


@pytest.mark.slow
def test_parameter_count_matches_real_models():
    from transformers import AutoModelForCausalLM, Qwen2Config

    for name in ("qwen2.5-7b", "qwen2.5-1.5b"):  # built on the meta device (shapes only), 2 of their layers
        s = dataclasses.replace(KNOWN_SHAPES[name], layers=2)
        cfg = Qwen2Config(vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.intermediate,
                          num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                          tie_word_embeddings=s.tied)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
        assert s.params == sum(p.numel() for p in model.parameters()), name
    assert round(KNOWN_SHAPES["qwen2.5-7b"].params / 1e9, 2) == 7.62  # the published 7.61B / 7.62B
    assert round(KNOWN_SHAPES["qwen2.5-14b"].params / 1e9, 1) == 14.8  # the published 14.7B


def test_local_model_folder_and_data_file(tmp_path, tiny_model_dir):
    shape = model_shape(str(tiny_model_dir))
    from transformers import AutoModelForCausalLM

    assert shape.params == sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_model_dir).parameters())
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": str(i), "question": "q", "answers": ["a"], "context": "c"}) + "\n"
                            for i in range(10)) + "\n")
    cfg = load_config(None, [f"model={tiny_model_dir}", f"data={data}", "rollout.batch_size=4",
                             "update.mini_batch_size=2", "dtype=float32", "strategy=ddp"])
    text = dry_run_report(cfg, gpus=2)
    assert "10 samples / rollout.batch_size 4 = 2.50 (5 optimiser steps)" in text
    est = estimate_for(cfg, shape, 2, checkpointing=False)
    assert est.weights == est.gradients == shape.params * 4  # DDP: every GPU holds everything
    assert est.optimizer == 2 * shape.params * 4 and est.rollout_copy == 0  # DDP generates with the live model
    assert "steps per epoch: unknown" in dry_run_report(load_config(None, [f"model={tiny_model_dir}"]), gpus=1)


def test_checkpointing_and_offload_arithmetic():
    s = KNOWN_SHAPES["qwen2.5-7b"]
    # 10 tokens, bf16: off = 10 x 28 x (6 x 3584 + 2 x 512 + 4 x 18944) x 2; on = 10 x (28 x 3584 x 2 + 196608)
    assert activation_bytes(s, 10, 2, False) == 10 * 28 * 98304 * 2
    assert activation_bytes(s, 10, 2, True) == 10 * (28 * 3584 * 2 + 98304 * 2)
    cfg = load_config(CFG_7B, ["model.cpu_offload=true"])
    est = estimate_for(cfg, s, 8, checkpointing=True)
    assert est.weights == est.optimizer == 0 and est.host == pytest.approx(5 * s.params * 2 / 8)


def test_unknown_model_is_one_clear_error(run_cli, tmp_path):
    code, out, err = run_cli("train", CFG_7B, "model=acme/llm-9b", "--dry-run")
    assert code == 2 and err.startswith("error: model 'acme/llm-9b' is not a local folder") and "Qwen/Qwen2.5-7B" in err
    assert "Traceback" not in err
    with pytest.raises(ConfigError, match="lacks a usable 'hidden_size'"):
        shape_from_config({"vocab_size": 10}, "x/config.json")
    (tmp_path / "m").mkdir()
    with pytest.raises(ConfigError, match="has no config.json"):
        model_shape(str(tmp_path / "m"))


def test_dry_run_7b_lora_counts_frozen_base_and_adapters(run_cli):
    # LoRA r = 16 on q_proj (3584 -> 3584) and v_proj (3584 -> 512), Qwen2.5-7B, 28 layers:
    #   q_proj: 16 x (3584 + 3584) = 114688; v_proj: 16 x (3584 + 512) = 65536 -> 180224 per layer
    #   x 28 layers = 5046272 adapter parameters (5.05M), float32 (peft): 4 bytes each
    #   weights: frozen base 7.62e9 x 2 / 8 = 1.905 GB + adapters 5046272 x 4 / 8 = 0.0025 GB  -> 1.91 GB
    #   gradients: adapters only 5046272 x 4 / 8 = 2.5 MB; AdamW m + v: 5.0 MB; no reference (adapters disabled)
    #   rollout copy 15.24 GB (as without LoRA)
    #   gathered: embeddings + head 2.18 GB + 2 layers x 233.4e6 x 2 B = 0.93 GB (no base gradients) -> 3.11 GB
    #   activations, checkpointing on: 6.51 GB as without LoRA + one layer's adapters' float32 saves
    #       16384 tokens x ((3584 + 16) + (3584 + 16)) x 4 B = 0.47 GB                           -> 6.98 GB
    #   logits 3.11 GB
    hand = 1.91 + 0.0025 + 0.005 + 15.24 + 3.11 + 6.98 + 3.11  # = 30.36 GB (37.96 without LoRA)
    code, out, err = run_cli("train", CFG_7B, "lora.r=16", "lora.target_modules=q_proj,v_proj", "--dry-run",
                             "--gpus", "8", "--samples", "1000")
    assert code == 0, err
    got = float(re.search(r"estimate: ([\d.]+) GB per GPU", out).group(1))
    assert abs(got - hand) / hand <= 0.02, (got, hand)
    assert "lora: r=16 on q_proj, v_proj: 5.05M adapter parameters" in out and "180224 per layer x 28 layers" in out
    assert "base weights are frozen (weights only: no gradients, no optimizer state)" in out
    rows = {m.group(1): float(m.group(3)) for m in re.finditer(r"^(\w+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)}
    assert rows["gradients"] == rows["reference"] == 0.0 and rows["optimizer"] == 0.01 and rows["weights"] == 1.91
    # without checkpointing every layer keeps its adapters' saves too: 28 x 0.47 GB on top of 90.19 GB
    off = float(re.search(r"^total\s+([\d.]+)", out, re.M).group(1))
    assert abs(off - (hand - 6.98 + 90.19 + 28 * 16384 * 7200 * 4 / 1e9)) <= 0.05


def test_adapter_count_matches_peft_and_unknown_targets_are_refused(tiny_model_dir):
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from memagent.rl.estimate import adapter_shape
    from memagent.rl.lora import apply_lora
    from memagent.rl.config import LoraConfig

    shape = model_shape(str(tiny_model_dir))
    for targets in (["q_proj", "v_proj"], ["k_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]):
        lora = LoraConfig(r=4, target_modules=targets)
        model = apply_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir), lora)
        trained = [p for p in model.parameters() if p.requires_grad]
        assert adapter_shape(shape, lora).params == sum(p.numel() for p in trained), targets
        assert {p.dtype for p in trained} == {torch.float32}
    assert adapter_shape(shape, LoraConfig(r=0)) is None
    vllm = dry_run_report(load_config(None, [f"model={tiny_model_dir}", "lora.r=4", "rollout.engine=vllm"]), gpus=1)
    assert "lora: rollout.engine=vllm gets the merged weights" in vllm and "merged weights" not in dry_run_report(
        load_config(None, [f"model={tiny_model_dir}", "lora.r=4"]), gpus=1)
    with pytest.raises(ConfigError, match="knows no linear layer named c_attn; known: q_proj"):
        adapter_shape(shape, LoraConfig(r=4, target_modules=["q_proj", "c_attn"]))
