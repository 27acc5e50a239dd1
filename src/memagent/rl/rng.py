"""A process's generator states (torch CPU/CUDA, Python `random`, NumPy) as tensors and JSON, for checkpoints."""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """This process's generator states: tensors (torch) and JSON-able values (random, NumPy)."""
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    version, state, gauss = random.getstate()
    np_state = np.random.get_state()
    meta = {
        "python": [version, list(state), gauss],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }
    return tensors, meta


def set_rng_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("torch_cuda_"))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    version, state, gauss = meta["python"]
    random.setstate((version, tuple(state), gauss))
    name, keys, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def seed_all(seed: int) -> None:
    """Seed torch, Python `random` and NumPy (a fresh run's rank, or a rank a resumed run did not have)."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
