"""One Multi-Conv DAPO step whose rollouts come from vLLM's in-process engine (rollout.engine=vllm, the rl/vllm path,
CPU build) on the real model: the step updates the policy, the sync pushes its weights into the engine, and then
the engine's weights equal the policy's (read back from vLLM's worker, in vLLM's fused layout) and its greedy
rollouts equal, token for token, those of the transformers backend over the updated policy."""
from __future__ import annotations

import dataclasses
import gc
import math

import pytest

from real_model import essay_document
from vllm_cases import KV_GIB

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")

AGENT = ["agent.chunk_tokens=64", "agent.memory_tokens=16", "agent.answer_tokens=8", "agent.query_tokens=32"]


def _samples(n=2):
    return [{"id": str(i), "question": f"What is the code of door {i}?",
             "document": essay_document(60, needle=f"The code of door {i} is {417 + i}.", depth=0.5),
             "answers": [str(417 + i)]} for i in range(n)]


def _alternating():
    """A reward of 0, 1, 0, 1, ... in call order, so the advantages are not all 0 (the 135M model writes no
    \\boxed{}): the test checks the machinery on real weights, not learning."""
    calls = []

    def reward(prediction, golds):
        calls.append(prediction)
        return float(len(calls) % 2)

    return reward


def _hf_view(name, hf):
    """The policy's tensor behind vLLM's parameter `name` (vLLM fuses q/k/v and gate/up of a llama layer)."""
    if name.endswith("qkv_proj.weight"):
        stem = name[: -len("qkv_proj.weight")]
        return torch.cat([hf[stem + p + "_proj.weight"] for p in "qkv"])
    if name.endswith("gate_up_proj.weight"):
        stem = name[: -len("gate_up_proj.weight")]
        return torch.cat([hf[stem + "gate_proj.weight"], hf[stem + "up_proj.weight"]])
    return hf[name]


def _engine_weights(worker):
    """Every weight of vLLM's model as it computes with it. vLLM's CPU build repacks each linear layer's weight for
    its kernels (the parameter is left empty), so a linear's weight is read back through its forward: the layer
    applied to the identity matrix is W^T, exactly (a product with 1 and sums of zeros round nothing)."""
    from vllm.model_executor.layers.linear import LinearBase

    model, out = worker.model_runner.model, {}
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, LinearBase):
                y = module(torch.eye(module.input_size, dtype=torch.float32))
                out[name + ".weight"] = (y[0] if isinstance(y, tuple) else y).T.contiguous()
        for name, p in model.named_parameters():
            if p.numel() and name not in out:
                out[name] = p.detach().to("cpu", torch.float32).clone()
    return out


def test_one_dapo_step_with_rollouts_from_the_synced_vllm_engine(real_model_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memagent.backends.hf import TransformersBackend
    from memagent.backends.vllm import KV_ENV, VLLMBackend
    from memagent.rl import trainer as trainer_module
    from memagent.rl.config import load_config
    from memagent.rl.rollout import generate_rollouts
    from memagent.rl.vllm.engine import VLLMRollout
    from memagent.rl.samples import load_samples

    monkeypatch.setenv(KV_ENV, KV_GIB)  # the engine's KV cache (the backend's CPU default is 2 GiB)
    engines, generated = [], []
    make = trainer_module.make_engine
    monkeypatch.setattr(trainer_module, "make_engine", lambda *a: engines.append(make(*a)) or engines[-1])
    counted = VLLMBackend.generate
    monkeypatch.setattr(VLLMBackend, "generate", lambda self, p, s: generated.append(len(p)) or counted(self, p, s))

    tok = AutoTokenizer.from_pretrained(real_model_dir)
    model = AutoModelForCausalLM.from_pretrained(real_model_dir, dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = load_config(None, [
        f"out_dir={tmp_path / 'run'}", f"model={real_model_dir}", "total_steps=1", "save_every=1", "progress=false",
        "rollout.engine=vllm", "rollout.batch_size=1", "rollout.group_size=4", "update.mini_batch_size=1",
        "update.micro_batch_size=8", *AGENT, "optim.lr=1e-4", "optim.warmup_steps=0"])
    res = train_once(cfg, model, tok)
    [engine] = engines
    assert isinstance(engine, VLLMRollout) and engine.backend().device == "cpu"
    assert sum(generated) >= 4 * 3  # the step's rollouts (4 samples x 2 chunks + answer) came from vLLM
    assert math.isfinite(res.metrics[0]["loss"]), res.metrics[0]
    policy = {n: p.detach() for n, p in res.model.state_dict().items()}
    assert max(float((p - before[n]).abs().max()) for n, p in res.model.named_parameters()) > 0  # the step moved it

    got = engine.llm.collective_rpc(_engine_weights)[0]  # after the step's sync
    assert len(got) == 2 + 6 * res.model.config.num_hidden_layers  # embed, norm (lm_head tied); 4 linears, 2 norms
    for name, t in got.items():
        assert torch.equal(t, _hf_view(name, policy)), name

    greedy = dataclasses.replace(cfg.agent, temperature=0.0)
    samples = load_samples(_samples())
    rows = {}
    for key, backend in (("vllm", engine.backend()),
                         ("hf", TransformersBackend(res.model.eval(), tok))):
        batch = generate_rollouts(backend, greedy, samples, [0, 1], 1, lambda p, g: 0.0, seed=0, per_sample=True)
        rows[key] = (batch.prompt_ids, batch.response_ids)
    assert len(rows["hf"][0]) == 2 * 3 and all(rows["hf"][1])  # 2 samples x (2 chunks + the answer), none empty
    assert rows["vllm"] == rows["hf"]
    del engine, engines[:]
    gc.collect()


def train_once(cfg, model, tok):
    from memagent.rl.trainer import train

    return train(cfg, _samples(), _alternating(), model=model, tokenizer=tok)
