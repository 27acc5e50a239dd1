"""Gradient checkpointing, the model.* options and packing inside the training loop."""
import pytest
import torch

from memagent.config import ConfigError
from memagent.rl.config import ModelOptions, load_config
from memagent.rl.distributed import DistInfo
from memagent.rl.model_options import load_kwargs, offload_policy, prepare_model

from rl_helpers import dapo, synthetic_minibatch, tiny_model

INFO = DistInfo()


def _grads(model, mb, tokens):
    from memagent.rl.objectives import Term, accumulate_gradients

    model.zero_grad(set_to_none=True)
    [m] = accumulate_gradients(model, [Term(dapo("token-mean"), 1.0, mb)], micro_batch_size=4, pad_id=0, info=INFO,
                               micro_batch_tokens=tokens)
    return {n: p.grad.clone() for n, p in model.named_parameters()}, m


@pytest.mark.parametrize("tokens", [0, 30])  # padded and packed
def test_gradient_checkpointing_gives_identical_gradients(tokens):
    mb = synthetic_minibatch(seed=4, n_samples=3)
    calls = {"plain": [], "ckpt": []}  # decoder layers' MLP calls: checkpointing runs each again in the backward pass
    plain = tiny_model()
    ckpt = prepare_model(tiny_model(), ModelOptions(gradient_checkpointing=True))
    for name, model in (("plain", plain), ("ckpt", ckpt)):
        for layer in model.model.layers:
            layer.mlp.register_forward_pre_hook(lambda *a, name=name: calls[name].append(1))
    ref, m_ref = _grads(plain, mb, tokens)
    got, m = _grads(ckpt, mb, tokens)
    assert len(calls["plain"]) > 0 and len(calls["ckpt"]) == 2 * len(calls["plain"])
    diff = max((got[k] - ref[k]).abs().max().item() for k in ref)
    assert diff <= 1e-12, diff
    assert m["loss"] == pytest.approx(m_ref["loss"], abs=1e-12)


def test_model_options_from_yaml_mapping_and_dotted_overrides(tmp_path):
    cfg = load_config(None, ["model=some/model", "model.gradient_checkpointing=true", "update.packing=true",
                             "update.micro_batch_tokens=4096"])
    assert cfg.model == "some/model" and cfg.model_options.gradient_checkpointing
    assert cfg.update.packed_tokens == 4096
    assert load_config(None, ["update.micro_batch_tokens=4096"]).update.packed_tokens == 0  # packing off: padded
    y = tmp_path / "c.yaml"
    y.write_text("model:\n  path: other/model\n  cpu_offload: true\nstrategy: fsdp\n")
    cfg = load_config(y, ["model.attn_implementation=eager"])
    assert cfg.model == "other/model" and cfg.model_options.cpu_offload
    assert cfg.model_options.attn_implementation == "eager" and not cfg.model_options.gradient_checkpointing
    with pytest.raises(ConfigError, match="model.attn_implementation 'fast' is unknown"):
        load_config(None, ["model.attn_implementation=fast"])
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(None, ["model.checkpointing=true"])


def test_offload_and_attention_choices():
    assert offload_policy(ModelOptions(), "fsdp") is None
    from torch.distributed.fsdp import CPUOffloadPolicy

    assert isinstance(offload_policy(ModelOptions(cpu_offload=True), "fsdp", "cuda"), CPUOffloadPolicy)
    with pytest.raises(ConfigError, match="strategy=fsdp"):
        offload_policy(ModelOptions(cpu_offload=True), "ddp", "cuda")
    with pytest.raises(ConfigError, match="needs GPUs"):  # FSDP2 offload cannot run without an accelerator
        offload_policy(ModelOptions(cpu_offload=True), "fsdp", "cpu")
    cpu = torch.device("cpu")
    assert load_kwargs(ModelOptions(), cpu) == {}  # auto on CPU: transformers' default
    assert load_kwargs(ModelOptions(attn_implementation="eager"), cpu) == {"attn_implementation": "eager"}


@pytest.mark.slow
def test_training_with_packing_and_checkpointing_matches_padded(tmp_path):
    """Two steps of the real loop: packed + checkpointed metrics equal the padded run's (float32 rounding)."""
    from test_rl_trainer import fresh_model, samples, small_config, symbol_reward, TIMING_KEYS
    from memagent.backends.tiny import build_tokenizer
    from memagent.rl.trainer import train

    tok = build_tokenizer(vocab_size=1024)
    runs = {}
    for name, extra in {"padded": [], "packed": ["update.packing=true", "update.micro_batch_tokens=200",
                                                 "model.gradient_checkpointing=true"]}.items():
        res = train(small_config(tmp_path / name, "total_steps=2", *extra), samples(), symbol_reward,
                    model=fresh_model(tok), tokenizer=tok)
        runs[name] = res.metrics
    for a, b in zip(runs["padded"], runs["packed"]):
        for k in a:
            if k not in TIMING_KEYS:
                assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-5), k
