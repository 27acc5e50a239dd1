"""The policy engine under FSDP2: its unsharded generating copy computes what the trained policy computes.

One process, a gloo group of 1 (a file store in tmp_path, no network), the policy sharded with FSDP2's
fully_shard on the CPU: the copy must carry the trained weights, with or without LoRA adapters (a copy left
with its random initial weights would sample rollouts from noise while training went on).
"""
import pytest
import torch
import torch.distributed as dist

from memagent.backends.base import BackendError
from memagent.rl.config import TrainConfig
from memagent.rl.distributed import DistInfo
from memagent.rl.rollout import PolicyRollout
from memagent.rl.scale_config import LoraConfig

from rl_helpers import tiny_model

IDS = torch.tensor([[3, 9, 14, 2, 40, 7, 21]])


@pytest.fixture
def gloo(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    dist.destroy_process_group()


def policy(lora: bool):
    model = tiny_model(seed=3)
    if lora:
        pytest.importorskip("peft")
        from memagent.rl.lora import apply_lora

        model = apply_lora(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        with torch.no_grad():  # trained adapters: B away from its zero start, so they change the outputs
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(0.5 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    return model


@pytest.mark.parametrize("lora", [False, True])
def test_the_fsdp_rollout_copy_computes_as_the_policy(gloo, lora):
    from torch.distributed.fsdp import fully_shard

    from memagent.backends.tiny import build_tokenizer

    model = policy(lora)
    with torch.no_grad():
        want = model(input_ids=IDS).logits
        if lora:
            from memagent.rl.lora import adapters_disabled

            with adapters_disabled(model):
                base = model(input_ids=IDS).logits
            assert (want - base).abs().max().item() > 1e-3  # the adapters matter
    fully_shard(model)
    engine = PolicyRollout(model, build_tokenizer(vocab_size=61), TrainConfig(), gloo)
    assert engine.copy is not None and engine.copy is not model
    with torch.no_grad():
        got = engine.copy(input_ids=IDS).logits
    assert (got - want).abs().max().item() <= 1e-12
    assert (type(engine.copy).__name__ == "PeftModelForCausalLM") == lora


def test_a_copy_that_does_not_match_the_weights_is_an_error(gloo):
    from torch.distributed.fsdp import fully_shard

    from memagent.backends.tiny import build_tokenizer

    model = policy(False)
    fully_shard(model)
    engine = PolicyRollout(model, build_tokenizer(vocab_size=61), TrainConfig(), gloo)
    engine.copy.extra = torch.nn.Linear(2, 2)  # a parameter the policy's state dict does not have
    with pytest.raises(BackendError, match="does not match"):
        engine.sync()


def test_merged_lora_weights_are_the_same_from_fsdp_shards(gloo):
    """What a vLLM engine is pushed (memagent.rl.vllm.engine.trained_weights) for a LoRA policy: the merged
    weights under the base names, the same gathered from FSDP2 shards as from the unsharded model."""
    import copy

    from torch.distributed.fsdp import fully_shard

    from memagent.rl.vllm.engine import trained_weights

    model = policy(True)
    want = copy.deepcopy(model).merge_and_unload().state_dict()
    plain = dict(trained_weights(model))
    fully_shard(model)
    sharded = dict(trained_weights(model))
    assert sorted(plain) == sorted(sharded) == sorted(want)
    for name, t in want.items():
        assert torch.allclose(plain[name], t, atol=1e-12) and torch.equal(sharded[name], plain[name]), name
