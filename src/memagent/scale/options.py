"""The `--ray [ADDRESS]` and `--ray-workers N` flags shared by `ask` and `eval`, and the worker plan they
give: one actor per endpoint (`--backend openai --base-url URL1,URL2`) or per in-process engine."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional, Sequence

from memagent.errors import InputError
from memagent.config import rule
from memagent.flags import check_options, flag

LOCAL = "local"  # `--ray` alone: start a Ray instance on this machine (Ray's own name for it)


@dataclass(frozen=True)
class RayOptions:
    """Where and how wide the Ray runner runs; `address` None: no Ray (the plain runner)."""

    address: Optional[str] = field(default=None, metadata=flag(
        "Shard the samples over Ray actors: --ray alone starts a local Ray instance, --ray auto joins the "
        "cluster of `ray start`, or give its address (host:port, ray://host:port).", "--ray"))
    workers: Optional[int] = field(default=None, metadata={**rule(min=1), **flag(
        "With --ray: actors to run (default: one per --base-url endpoint for openai; one per GPU of the "
        "cluster for transformers/vllm, or 1 without GPUs).", "--ray-workers")})

    checks_itself: ClassVar[bool] = True  # checked as built (memagent.flags.check_options does not again)

    def __post_init__(self) -> None:
        self.check()  # as they are built: once on every path (the CLI, ask's and eval's Ray runs, Python)

    def check(self) -> None:
        """Refuse a --ray-workers without --ray, a count below 1, or an empty address."""
        if self.workers is not None and self.address is None:
            raise InputError("--ray-workers is for --ray; add --ray (a local instance) or --ray ADDRESS")
        check_options(self)  # --ray-workers >= 1, beside its field
        if self.address is not None and not self.address.strip():
            raise InputError("--ray ADDRESS is empty; give auto, host:port, or --ray alone for a local instance")


def bare_ray_flag(args: Sequence[str]) -> list[str]:
    """Command-line arguments with a bare `--ray` (last, or followed by another option) given its value
    `local`, so `--ray` works with or without an address."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg == "--ray" and (i + 1 == len(out) or out[i + 1].startswith("-")):
            out[i] = f"--ray={LOCAL}"
    return out


@dataclass(frozen=True)
class WorkerSpec:
    """One actor: its backend options (one endpoint for openai) and the Ray resources it holds."""

    backend: Any  # memagent.backends.options.BackendOptions
    num_cpus: float
    num_gpus: float


def endpoints(base_url: Optional[str]) -> list[Optional[str]]:
    """The endpoints of `--base-url URL1,URL2` (one None when unset)."""
    if base_url is None:
        return [None]
    urls = [u.strip() for u in base_url.split(",") if u.strip()]
    if not urls:
        raise InputError(f"--base-url {base_url!r} names no URL; give URL1[,URL2,...]")
    return urls


def plan_workers(backend: Any, workers: Optional[int], cluster_gpus: float) -> list[WorkerSpec]:
    """The actors of a run. openai: one per endpoint (`workers` of them, endpoints taken in turn), each
    with the whole --max-concurrency and no CPU reserved (it waits on the network). In-process engines:
    `workers` actors (default one per GPU of the cluster, else 1), each holding a GPU (vllm: --tensor-parallel
    of them) when the cluster has GPUs and --device is not cpu, else one CPU."""
    if backend.name == "openai":
        urls = endpoints(backend.base_url)
        n = workers or len(urls)
        return [WorkerSpec(dataclasses.replace(backend, base_url=urls[i % len(urls)]), 0.0, 0.0) for i in range(n)]
    per_actor = backend.tensor_parallel if backend.name == "vllm" else 1
    on_gpu = cluster_gpus >= per_actor and backend.device != "cpu"
    n = workers or (int(cluster_gpus // per_actor) if on_gpu else 1)
    if on_gpu:
        return [WorkerSpec(backend, 1.0, float(per_actor))] * n
    return [WorkerSpec(backend, 1.0, 0.0)] * n
