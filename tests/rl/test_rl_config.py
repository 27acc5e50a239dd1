"""TrainConfig: paper defaults, YAML + overrides, validation messages."""
import pytest

from memagent.config import ConfigError
from memagent.rl.config import OptimConfig, TrainConfig, load_config, parse_overrides


def test_paper_defaults():
    c = TrainConfig()
    assert (c.rollout.group_size, c.rollout.batch_size) == (16, 128)
    assert (c.loss.clip_low, c.loss.clip_high, c.loss.clip_c) == (0.2, 0.28, 3.0)
    assert (c.loss.kl_coef, c.loss.kl_kind, c.loss.agg, c.loss.norm_by_std) == (1e-3, "k3", "token-mean", False)
    assert (c.optim.lr, c.optim.warmup_steps, c.optim.weight_decay, c.optim.grad_clip) == (1e-6, 20, 0.01, 1.0)
    assert c.num_mini_batches == 16  # 16 optimiser mini-batches per rollout batch
    assert c.agent.temperature == 1.0 and c.agent.top_p == 1.0


def test_yaml_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("seed: 3\nrollout:\n  batch_size: 4\n  group_size: 2\nupdate:\n  mini_batch_size: 2\n"
                 "agent:\n  chunk_tokens: 16\noptim:\n  lr: 1e-4\n")
    c = load_config(p, ["loss.clip_high=0.3", "loss.kl_coef=0", "optim.warmup_steps=0", "progress=false"])
    assert c.seed == 3 and c.rollout.batch_size == 4 and c.rollout.group_size == 2
    assert c.optim.lr == 1e-4  # YAML 1.1 reads "1e-4" as a string: coerced to float
    assert c.loss.clip_high == 0.3 and c.loss.kl_coef == 0.0 and c.optim.warmup_steps == 0
    assert c.progress is False
    # a nested section given partly keeps the training defaults of the rest (temperature 1.0)
    assert c.agent.chunk_tokens == 16 and c.agent.temperature == 1.0
    assert c.loss.clip_low == 0.2 and c.rollout.dynamic_sampling is False


def test_parse_overrides_nested():
    assert parse_overrides(["a.b=1", "a.c=x", "d=[1, 2]"]) == {"a": {"b": 1, "c": "x"}, "d": [1, 2]}
    with pytest.raises(ConfigError, match="not key=value"):
        parse_overrides(["novalue"])


@pytest.mark.parametrize("overrides,message", [
    (["rollout.group_size=1"], "group_size must be >= 2"),
    (["update.mini_batch_size=5"], "must divide rollout.batch_size .128.; e.g. set update.mini_batch_size=4"),
    (["loss.clip_high=0.1"], "clip_high .0.1. must be >= loss.clip_low"),
    (["loss.agg=mean"], "choose one of: token-mean, seq-mean-token-mean"),
    (["loss.kl_kind=k9"], "choose one of: k1, k2, k3"),
    (["agent.temperature=0"], "temperature must be > 0 for rollouts"),
    (["rollout.batchsize=3"], r"unknown key\(s\) rollout.batchsize; valid keys under rollout: batch_size"),
    (["lr=3"], r"unknown key\(s\) lr; valid keys: model"),
    (["total_steps=many"], "total_steps must be int"),
    (["optim.lr=-1"], "optim.lr must be positive"),
    (["strategy=zero3"], "'ddp' or 'fsdp'"),
])
def test_validation_messages(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_missing_file_is_clear(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_lr_factor_constant_and_cosine_by_hand():
    from memagent.rl.recipe import lr_factor

    # warm-up 4: 1/4, 2/4, 3/4, 4/4; constant afterwards
    assert [lr_factor(s, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    # cosine, warm-up 2, total 6: the decay spans steps 2..6, p = 0, 1/4, 2/4, 3/4, then clamped at 1
    f = [lr_factor(s, 2, 6, "cosine") for s in range(8)]
    assert f[:2] == [0.5, 1.0]
    assert f[2:] == pytest.approx([1.0, (1 + 2 ** -0.5) / 2, 0.5, (1 - 2 ** -0.5) / 2, 0.0, 0.0])
    # min_ratio 0.1: 0.1 + 0.9 * the plain factor
    assert lr_factor(4, 2, 6, "cosine", 0.1) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_factor(50, 0, 6, "cosine", 0.1) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="total_steps"):
        lr_factor(3, 0, None, "cosine")


def test_cosine_schedule_drives_the_optimiser_and_bad_settings_fail():
    import torch

    from memagent.rl.recipe import make_optimizer

    model = torch.nn.Linear(2, 1)
    opt, sched = make_optimizer(model, OptimConfig(lr=0.1, warmup_steps=0, schedule="cosine"), total_steps=4)
    lrs = []
    for _ in range(4):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.1, 0.1 * (1 + 2 ** -0.5) / 2, 0.05, 0.1 * (1 - 2 ** -0.5) / 2])
    with pytest.raises(ValueError, match="total optimiser steps"):
        make_optimizer(model, OptimConfig(lr=0.1, schedule="cosine"))
    with pytest.raises(ConfigError, match="schedule"):
        OptimConfig(schedule="linear")
    with pytest.raises(ConfigError, match="min_lr_ratio"):
        OptimConfig(schedule="cosine", min_lr_ratio=1.5)


def test_key_aliases_table():
    from memagent.rl.config_aliases import canonical_key

    assert canonical_key(["data"], "f.jsonl") == ["data", "path"]
    assert canonical_key(["data"], {"path": "f.jsonl"}) == ["data"]  # a mapping is the section itself
    assert canonical_key(["model", "path"], "m") == ["model"]
    assert canonical_key(["model", "cpu_offload"], True) == ["model_options", "cpu_offload"]
    assert canonical_key(["model", "a", "b"], 1) == ["model_options", "a", "b"]
    assert canonical_key(["model"], "m") == ["model"] and canonical_key(["val", "data"], "v") == ["val", "data"]


def test_aliases_equal_the_spelled_out_keys_in_yaml_and_overrides(tmp_path):
    short = load_config(None, ["data=f.jsonl", "data.max_chunks=3", "model.path=m", "model.gradient_checkpointing=true"])
    full = load_config(None, ["data.path=f.jsonl", "data.max_chunks=3", "model=m",
                              "model_options.gradient_checkpointing=true"])
    assert short == full and (short.data.path, short.model) == ("f.jsonl", "m")
    assert short.model_options.gradient_checkpointing and not TrainConfig().model_options.gradient_checkpointing
    y = tmp_path / "c.yaml"
    y.write_text("data: f.jsonl\nmodel:\n  path: m\n  cpu_offload: true\n"
                 "model_options:\n  cpu_offload: false\n  attn_implementation: eager\nstrategy: fsdp\n")
    cfg = load_config(y, ["data.max_chunks=3"])
    assert (cfg.data.path, cfg.data.max_chunks, cfg.model) == ("f.jsonl", 3, "m")
    assert cfg.model_options.cpu_offload and cfg.model_options.attn_implementation == "eager"  # the alias wins
    assert load_config(y, ["model_options.cpu_offload=false"]).model_options.cpu_offload is False  # overrides win
    with pytest.raises(ConfigError, match=r"unknown key\(s\) model_options.speed"):
        load_config(None, ["model.speed=3"])
