"""Rollout engines: which model generates the rollouts, and how it follows the trained weights.

`PolicyRollout` (the default) generates with the trained policy itself through the
`transformers` backend. Single process and DDP: the live model, nothing to sync. FSDP2: sharded
parameters cannot generate (every forward is a collective and ranks decode different lengths),
so each rank keeps a full, unsharded copy that is refreshed from the shards after every update.
"""
from __future__ import annotations

from typing import Any

from torch import nn

from memagent.rl.config import TrainConfig
from memagent.rl.distributed import DistInfo, full_state_dict, is_fsdp, unwrap


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
        """The backend to generate this step's rollouts with (model put in eval mode)."""
        self._backend.model.eval()
        return self._backend

    def sync(self) -> None:
        """Bring the generating copy up to date with the trained weights (FSDP2 only)."""
        if self.copy is None:
            return
        full = full_state_dict(self.model, all_ranks=True)
        self.copy.load_state_dict({k: v.to(self.info.device) for k, v in full.items()}, strict=False)
