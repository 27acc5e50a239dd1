"""Rollout engines: which model generates the rollouts, and how it follows the trained weights.

A `RolloutEngine` hands out the backend that generates one step's rollouts and, after every
update, brings that backend's weights up to date (`sync`, a collective under FSDP2: every rank
calls it). An engine may also have `offload()`, called after the rollouts and before the update
(a sleeping vLLM engine frees its GPU memory there). `make_engine` builds the one named by
`rollout.engine`:

    policy       the trained policy itself, through the `transformers` backend. Single process and
                 DDP: the live model, nothing to sync. FSDP2: sharded parameters cannot generate
                 (every forward is a collective and ranks decode different lengths), so each rank
                 keeps a full, unsharded copy that is refreshed from the shards after every update.
    vllm         a vLLM engine in the training process (`pip install 'memagent[vllm]'`, vLLM >=
                 weight_sync.MIN_VLLM, imported only when chosen), colocated with training on each
                 rank's GPU (`vllm.gpu_memory_utilization`). After every update the weights are
                 pushed with `LLM.collective_rpc` into each worker's `load_weights`, in chunks of
                 `vllm.sync_chunk_mb`; with `vllm.sleep` the engine sleeps (level 1: weights to CPU,
                 KV cache freed) during the update and wakes for the push. The engine core runs in
                 this process (VLLM_ENABLE_V1_MULTIPROCESSING=0 unless set), so tensors are not copied.
    vllm-server  an external vLLM server on other GPUs: rollouts over HTTP (the `openai` backend,
                 token ids and log-probs from vLLM's `return_token_ids`), weights broadcast over
                 NCCL by rank 0 (`weight_sync.ServerWeights`). Start the server as
                 `VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --worker-extension-cls
                 memagent.rl.vllm_worker.WeightReceiver` (MODEL as in the config's `model`).
The vLLM engines are NOT exercised by the CPU test-suite beyond fakes (scripts/gpu_check.sh runs
them on a GPU); keep `update.old_logprobs` "recompute" with them, since vLLM's sampling numerics
differ from the trainer's.
"""
from __future__ import annotations

import os
from typing import Any, Protocol

from torch import nn

from memagent.backends.base import Backend, BackendError
from memagent.rl.config import TrainConfig
from memagent.rl.distributed import DistInfo, all_gather_objects, full_state_dict, is_fsdp, unwrap
from memagent.rl.weight_sync import WORKER_EXTENSION, ServerWeights, check_vllm_version, push_in_process, trained_weights

MIB = 1 << 20


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
        if is_fsdp(model):  # a LoRA policy's copy is a peft model too: the same names, base + adapters
            from memagent.rl.lora import empty_twin

            self.copy = empty_twin(model).to(info.device).eval().requires_grad_(False)
            gen_model = self.copy
            self.sync()
        self._backend = TransformersBackend(gen_model, tokenizer, max_batch_size=cfg.rollout.max_batch_size,
                                            want_logprobs=cfg.update.old_logprobs == "rollout",
                                            chat_template_kwargs=cfg.chat_template_kwargs)

    def backend(self) -> Any:
        """The transformers backend, its model put in eval mode."""
        self._backend.model.eval()
        return self._backend

    def sync(self) -> None:
        """Refresh the generating copy from the shards (FSDP2 only; otherwise the live model generates)."""
        if self.copy is None:
            return
        full = full_state_dict(self.model, all_ranks=True)
        got = self.copy.load_state_dict({k: v.to(self.info.device) for k, v in full.items()}, strict=False)
        if got.missing_keys or got.unexpected_keys:  # a copy left with random weights would sample noise
            raise BackendError(f"the rollout copy of the FSDP2 policy does not match its weights: missing "
                               f"{got.missing_keys[:3]}, unexpected {got.unexpected_keys[:3]}")


def import_vllm(what: str) -> Any:
    """The vllm module, checked to be recent enough for `what`."""
    try:
        import vllm
    except ImportError:
        raise BackendError(f"{what} needs vLLM: pip install 'memagent[vllm]' (Linux + CUDA GPU)") from None
    check_vllm_version(str(getattr(vllm, "__version__", "0")), what)
    return vllm


class VLLMRollout:
    """rollout.engine=vllm: an in-process vLLM engine per rank, fed the weights by collective_rpc."""

    def __init__(self, model: nn.Module, tokenizer: Any, cfg: TrainConfig, info: DistInfo) -> None:
        from memagent.backends.vllm import VLLMBackend

        if not cfg.model:
            raise BackendError("rollout.engine=vllm needs `model` (a path or Hugging Face id) in the config")
        import_vllm("rollout.engine=vllm (weights pushed by LLM.collective_rpc)")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        extra: dict[str, Any] = {"worker_extension_cls": WORKER_EXTENSION, "enable_sleep_mode": cfg.vllm.sleep}
        if info.enabled:  # one engine per torchrun rank, on that rank's GPU
            extra["distributed_executor_backend"] = "external_launcher"
        self.model, self.info, self.cfg = model, info, cfg
        self._backend = VLLMBackend(cfg.model, gpu_memory_utilization=cfg.vllm.gpu_memory_utilization,
                                    want_logprobs=cfg.update.old_logprobs == "rollout",
                                    chat_template_kwargs=cfg.chat_template_kwargs, **extra)
        self.llm = self._backend.llm
        self.asleep = False
        self.sync()  # a resumed run starts from the checkpoint's weights, not config.model's

    def backend(self) -> Any:
        if self.asleep:  # offloaded without a sync since (a run that stopped between them)
            self.llm.wake_up()
            self.asleep = False
        return self._backend

    def offload(self) -> None:
        """With vllm.sleep: free the engine's GPU memory for the update (weights kept on CPU)."""
        if self.cfg.vllm.sleep and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def sync(self) -> None:
        """Push the trained weights into the engine, chunk by chunk (every rank calls it)."""
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        to_cpu = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0"
        push_in_process(self.llm, trained_weights(self.model), self.cfg.vllm.sync_chunk_mb * MIB, to_cpu=to_cpu)
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()  # cached KV was computed with the old weights


class ServerRollout:
    """rollout.engine=vllm-server: generation over HTTP, weights by NCCL broadcast from rank 0.
    backend / weights: given by tests; default an OpenAIBackend and a ServerWeights on the config."""

    def __init__(self, model: nn.Module, tokenizer: Any, cfg: TrainConfig, info: DistInfo,
                 backend: Any = None, weights: ServerWeights | None = None) -> None:
        v = cfg.vllm
        if not cfg.model or not v.server_url:
            raise BackendError("rollout.engine=vllm-server needs `model` (as the server serves it) and "
                               "vllm.server_url (e.g. http://gpu7:8000)")
        if backend is None:
            from memagent.backends.openai import OpenAIBackend

            backend = OpenAIBackend(cfg.model, base_url=v.server_url.rstrip("/") + "/v1", tokenizer=tokenizer,
                                    timeout=v.timeout, max_concurrency=64, request_token_ids=True,
                                    want_logprobs=cfg.update.old_logprobs == "rollout",
                                    chat_template_kwargs=cfg.chat_template_kwargs)
        self.model, self.info, self.cfg, self._backend = model, info, cfg, backend
        self.weights = None
        if info.is_main:
            if weights is None:
                import_vllm("rollout.engine=vllm-server (the NCCL weight broadcast)")
                weights = ServerWeights(v.server_url, v.nccl_host, v.nccl_port, v.timeout)
            self.weights = weights
            self.weights.connect(info.device)
        self.sync()  # a resumed run starts from the checkpoint's weights, not config.model's

    def backend(self) -> Any:
        return self._backend

    def sync(self) -> None:
        """Rank 0 broadcasts the weights (under FSDP every rank gathers them); all wait for the push."""
        named = trained_weights(self.model)
        if self.weights is not None:
            self.weights.push(named, self.cfg.vllm.sync_chunk_mb * MIB)
        elif is_fsdp(self.model):
            for _ in named:  # the gathers are collectives: every rank takes part
                pass
        all_gather_objects(None, self.info)  # no rank generates before the server has the new weights


ENGINES = {"policy": PolicyRollout, "vllm": VLLMRollout, "vllm-server": ServerRollout}


def make_engine(model: nn.Module, tokenizer: Any, cfg: TrainConfig, info: DistInfo) -> RolloutEngine:
    """The engine named by `cfg.rollout.engine` (validated by RolloutConfig)."""
    return ENGINES[cfg.rollout.engine](model, tokenizer, cfg, info)
