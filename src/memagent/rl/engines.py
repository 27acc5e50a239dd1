"""Rollout engines: which model generates the rollouts, and how it follows the trained weights.

A `RolloutEngine` hands out the backend that generates one step's rollouts and, after every
update, brings that backend's weights up to date (`sync`, a collective under FSDP2: every rank
calls it). `make_engine` builds the one named by `rollout.engine`:

    policy  the trained policy itself, through the `transformers` backend. Single process and DDP:
            the live model, nothing to sync. FSDP2: sharded parameters cannot generate (every forward
            is a collective and ranks decode different lengths), so each rank keeps a full,
            unsharded copy that is refreshed from the shards after every update.
    vllm    a vLLM engine in the training process (optional; `pip install 'memagent[vllm]'`,
            imported only when chosen). Each rank starts its own engine on its own GPU from
            `config.model` (vLLM's `gpu_memory_utilization` lowered to 0.3 to fit next to
            training); after every update the trained weights are pushed into the engine in place,
            the "colocate" pattern TRL uses. That attribute path belongs to vLLM's in-process
            (V0-style) executor; a vLLM without it raises a BackendError naming the fix. NOT
            exercised by the CPU test-suite; keep `update.old_logprobs` "recompute" with vLLM, since
            its sampling numerics differ from the trainer's.
"""
from __future__ import annotations

from typing import Any, Protocol

from torch import nn

from memagent.backends.base import Backend, BackendError
from memagent.rl.config import TrainConfig
from memagent.rl.distributed import DistInfo, full_state_dict, is_fsdp, unwrap


class RolloutEngine(Protocol):
    def backend(self) -> Backend:
        """The backend to generate this step's rollouts with."""
        ...

    def sync(self) -> None:
        """Bring the generating weights up to date with the trained ones (every rank calls it)."""
        ...


class PolicyRollout:
    def __init__(self, model: nn.Module, tokenizer: Any, cfg: TrainConfig, info: DistInfo) -> None:
        from memagent.backends.hf import TransformersBackend

        self.model, self.info = model, info
        self.copy: nn.Module | None = None
        gen_model = unwrap(model)
        if is_fsdp(model):
            from transformers import AutoModelForCausalLM

            base = unwrap(model)
            self.copy = AutoModelForCausalLM.from_config(base.config).to(dtype=next(base.parameters()).dtype)
            self.copy.to(info.device).eval().requires_grad_(False)
            self.copy.generation_config = base.generation_config
            gen_model = self.copy
            self.sync()
        self._backend = TransformersBackend(gen_model, tokenizer, max_batch_size=cfg.rollout.max_batch_size,
                                            want_logprobs=cfg.update.old_logprobs == "rollout")

    def backend(self) -> Any:
        """The transformers backend, its model put in eval mode."""
        self._backend.model.eval()
        return self._backend

    def sync(self) -> None:
        """Refresh the generating copy from the shards (FSDP2 only; otherwise the live model generates)."""
        if self.copy is None:
            return
        full = full_state_dict(self.model, all_ranks=True)
        self.copy.load_state_dict({k: v.to(self.info.device) for k, v in full.items()}, strict=False)


class VLLMRollout:
    def __init__(self, model: nn.Module, tokenizer: Any, cfg: TrainConfig, info: DistInfo) -> None:
        from memagent.backends.vllm import VLLMBackend

        if not cfg.model:
            raise BackendError("rollout.engine=vllm needs `model` (a path or Hugging Face id) in the config")
        self.model, self.info = model, info
        self._backend = VLLMBackend(cfg.model, gpu_memory_utilization=0.3,
                                    want_logprobs=cfg.update.old_logprobs == "rollout")
        self.sync()  # a resumed run starts from the checkpoint's weights, not config.model's

    def backend(self) -> Any:
        return self._backend

    def sync(self) -> None:
        """Copy the trained weights into the engine (collective under FSDP: every rank calls it)."""
        weights = full_state_dict(self.model, all_ranks=True)
        try:
            target = self._backend.llm.llm_engine.model_executor.driver_worker.model_runner.model
        except AttributeError:
            raise BackendError("this vLLM version offers no in-process weight loading; "
                               "train with rollout.engine=policy") from None
        target.load_weights(list(weights.items()))


ENGINES = {"policy": PolicyRollout, "vllm": VLLMRollout}


def make_engine(model: nn.Module, tokenizer: Any, cfg: TrainConfig, info: DistInfo) -> RolloutEngine:
    """The engine named by `cfg.rollout.engine` (validated by RolloutConfig)."""
    return ENGINES[cfg.rollout.engine](model, tokenizer, cfg, info)
