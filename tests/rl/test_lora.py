"""LoRA (peft): only the adapters train, the KL reference is the base with adapters disabled, a run learns,
its checkpoints hold the adapters, resume is exact, and `memagent merge-lora` gives a full model with the same outputs."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl_helpers import tiny_model
from test_rl_trainer import TIMING_KEYS, fresh_model, samples, small_config, symbol_reward

from memagent.config import ConfigError
from memagent.rl.config import load_config
from memagent.rl.lora import adapters_disabled, apply_lora, is_lora, merge_lora
from memagent.rl.config import LoraConfig
from memagent.rl.trainer import train

pytest.importorskip("peft")
SRC = Path(__file__).parents[2] / "src"
ALL = "lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head]"


@pytest.fixture(scope="module")
def tok():
    from memagent.backends.tiny import build_tokenizer

    return build_tokenizer(vocab_size=1024)


def perturbed_lora(model, r=4, targets=("q_proj", "v_proj", "down_proj"), seed=1):
    """`model` with adapters whose B is random (peft starts B at 0, which would make them a no-op)."""
    peft_model = apply_lora(model, LoraConfig(r=r, alpha=8, target_modules=list(targets)))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return peft_model


def test_config_checks():
    assert load_config(None, []).lora.r == 0  # LoRA is off unless asked for
    cfg = load_config(None, ["lora.r=8", "lora.target_modules=q_proj,v_proj"])
    assert cfg.lora.r == 8 and cfg.lora.target_modules == ["q_proj", "v_proj"]
    for bad, what in [("lora.r=-1", "lora.r"), ("lora.alpha=0", "lora.alpha"), ("lora.dropout=1", "lora.dropout"),
                      ("lora.target_modules=[]", "target_modules"), ("checkpoint.format=zip", "checkpoint.format"),
                      ("checkpoint.async_save=true", "async_save")]:
        with pytest.raises(ConfigError, match=what):
            load_config(None, [bad])
    with pytest.raises(ConfigError, match="no linear layer named qkv.*q_proj"):
        apply_lora(tiny_model(), LoraConfig(r=2, target_modules=["qkv"]))
    assert is_lora(apply_lora(tiny_model(), LoraConfig(r=2), engine="vllm"))  # vLLM gets the merged weights
    tied = tiny_model()
    tied.config.tie_word_embeddings = True
    with pytest.raises(ConfigError, match="lm_head, tied to the input embeddings"):
        apply_lora(tied, LoraConfig(r=2, target_modules=["q_proj", "lm_head"]), engine="vllm")


def test_without_peft_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'memagent\[lora\]'"):
        apply_lora(tiny_model(), LoraConfig(r=2))


def test_reference_is_the_base_model_with_adapters_disabled():
    ids = torch.tensor([[3, 14, 15, 9, 26, 5]])
    base = tiny_model()
    want = base(ids).logits.detach().clone()
    frozen = {n: p.detach().clone() for n, p in base.named_parameters()}
    model = perturbed_lora(base)
    assert is_lora(model) and not is_lora(tiny_model())
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)  # 2 layers x 3 targets x (A, B)
    assert len(trainable) == 12
    with adapters_disabled(model):
        assert torch.equal(model(ids).logits, want)  # no second copy: the same weights, adapters bypassed
    assert (model(ids).logits - want).abs().max() > 1e-3  # the adapters are active again after the block
    for name, p in frozen.items():  # the base tensors are the original ones, untouched
        for t in ("q_proj", "v_proj", "down_proj"):  # peft moves a wrapped layer's tensors under base_layer
            name = name.replace(f".{t}.", f".{t}.base_layer.")
        assert torch.equal(p, dict(model.get_base_model().named_parameters())[name]), name


@pytest.mark.parametrize("targets", [("q_proj", "v_proj", "down_proj"), ("o_proj", "lm_head")])
def test_merged_model_gives_the_outputs_of_base_plus_adapters(tmp_path, targets):
    """lm_head shares its weight with the embeddings (tied): its merged adapter must change the head only."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[3, 14, 15, 9, 26, 5, 35]])
    tiny_model().save_pretrained(tmp_path / "base")
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    assert base.lm_head.weight is base.model.embed_tokens.weight
    perturbed_lora(base, targets=targets).save_pretrained(tmp_path / "adapters")
    assert not (tmp_path / "adapters" / "model.safetensors").exists()  # adapters only
    with pytest.raises(ConfigError, match="no LoRA adapters"):
        merge_lora(tmp_path / "base", tmp_path / "bad", base=str(tmp_path / "base"))
    out = merge_lora(tmp_path / "adapters", tmp_path / "merged", base=str(tmp_path / "base"))
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    ref = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "base"), tmp_path / "adapters")
    got, want = merged(ids).logits, ref(ids).logits
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base")(ids).logits
    assert (want - base).abs().max() > 1e-3  # the adapters matter
    assert (got - want).abs().max() < 1e-5


@pytest.mark.slow
def test_lora_run_learns_and_only_adapters_change(tok, tmp_path):
    model = fresh_model(tok)
    model.save_pretrained(tmp_path / "base")
    base = {n: p for n, p in model.named_parameters()}  # the tensors themselves: peft keeps them as base_layer
    before = {n: p.detach().clone() for n, p in base.items()}
    cfg = small_config(tmp_path / "run", "total_steps=8", "lora.r=16", "lora.alpha=32", "optim.lr=2e-2", ALL,
                       f"model={tmp_path / 'base'}")
    res = train(cfg, samples(), symbol_reward, model=model, tokenizer=tok)
    rewards = [r["reward"] for r in res.metrics]
    print("lora reward curve", [round(r, 3) for r in rewards])  # measured: .28 .28 .22 .31 .34 .53 .84 .97
    assert sum(rewards[:2]) / 2 < 0.4 and sum(rewards[-2:]) / 2 > 0.85, rewards
    assert all(torch.equal(p.detach(), before[n]) for n, p in base.items())  # every base weight bit-identical
    lora = {n: p for n, p in res.model.named_parameters() if p.requires_grad}
    assert lora and all("lora_" in n for n in lora)
    assert all(p.abs().max() > 0 for n, p in lora.items() if "lora_B" in n)  # B started at 0: the adapters learned
    saved = sorted(p.name for p in (res.checkpoint / "model").iterdir())
    assert "adapter_model.safetensors" in saved and "model.safetensors" not in saved
    # merge through the command; the merged model gives the trained policy's outputs
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(SRC))
    p = subprocess.run([sys.executable, "-m", "memagent.cli", "merge-lora", res.checkpoint, tmp_path / "merged"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    ids = torch.tensor([tok("the key 3 has the value")["input_ids"]])
    assert (merged(ids).logits - res.model(ids).logits).abs().max() < 1e-5
    again = subprocess.run([sys.executable, "-m", "memagent.cli", "merge-lora", res.checkpoint, tmp_path / "merged"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "error:" in again.stderr and "Traceback" not in again.stderr


def test_lora_resume_matches_uninterrupted_run(tok, tmp_path):
    extra = ["total_steps=3", "save_every=1", "rollout.batch_size=2", "rollout.group_size=2", "update.mini_batch_size=1",
             "loss.kl_coef=0.01", "lora.r=4", "optim.lr=2e-2"]
    full = train(small_config(tmp_path / "a", *extra), samples(), symbol_reward, model=fresh_model(tok), tokenizer=tok)
    assert all(r["kl"] >= 0 for r in full.metrics) and full.metrics[-1]["kl"] > 0  # the base is the reference
    train(small_config(tmp_path / "b", *extra), samples(), symbol_reward, model=fresh_model(tok), tokenizer=tok,
          callback=lambda step, m: step < 1)
    resumed = train(small_config(tmp_path / "b", *extra, "resume=true"), samples(), symbol_reward,
                    model=fresh_model(tok), tokenizer=tok)
    assert [r["step"] for r in resumed.metrics] == [2, 3]
    for a, b in zip(full.metrics[1:], resumed.metrics):
        assert {k: v for k, v in a.items() if k not in TIMING_KEYS} == {k: v for k, v in b.items() if k not in TIMING_KEYS}
    with pytest.raises(ConfigError, match="lora.r"):  # resuming adapters without LoRA says what to set
        train(small_config(tmp_path / "b", *extra[:-2], "resume=true", "total_steps=4"), samples(), symbol_reward,
              model=fresh_model(tok), tokenizer=tok)
