"""Pushing the trained weights into vLLM: in chunks, through vLLM's supported entry points.

Two transports, both ending in the worker's own `model_runner.model.load_weights` (the worker
side is `memagent.rl.vllm_worker.WeightReceiver`, given to vLLM as `worker_extension_cls`):

    in-process  `LLM.collective_rpc("memagent_load_weights", args=(chunk,))`, one call per chunk of
                at most `vllm.sync_chunk_mb` MiB (`push_in_process`).
    server      an external `vllm serve` (dev mode) reached over HTTP: POST /collective_rpc tells
                its workers which tensors come next, and the tensors themselves travel by NCCL
                broadcast from this process (rank 0) to the workers (ranks 1..n) of a communicator
                made for the purpose (`ServerWeights`), the pattern of TRL's vLLM server mode.
                POST /reset_prefix_cache then drops KV entries computed with the old weights.

Only the chunking, the version check and the message flow run on CPU (tested with fakes); the
NCCL and vLLM calls need a GPU (scripts/gpu_check.sh).
"""
from __future__ import annotations

import json
import threading
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn

from memagent.backends.base import BackendError
from memagent.config import ConfigError
from memagent.rl.distributed import unwrap

MIN_VLLM = "0.10.2"  # LLM.collective_rpc with worker_extension_cls, sleep/wake_up(tags), return_token_ids
WORKER_EXTENSION = "memagent.rl.vllm_worker.WeightReceiver"

Named = list[tuple[str, torch.Tensor]]


def check_vllm_version(found: str, what: str, need: str = MIN_VLLM) -> None:
    """ConfigError unless vLLM version `found` is at least `need`."""
    from packaging.version import InvalidVersion, Version

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
    from memagent.rl.lora import is_lora, merged_weights

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
    group: makes this process's NCCL communicator (default `vllm_worker.nccl_group`); it must have
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
        import httpx

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
        make = self._group
        if make is None:
            from memagent.rl.vllm_worker import nccl_group as make
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
