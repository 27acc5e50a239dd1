"""The demo's float kernels, pinned so that `make demo` prints the same table on every machine of a kind.

Why: the warm-up is 1,500 SFT steps on a 0.17M-parameter model, and a different rounding in one matrix
product early on ends in different weights. On 2 CPU cores the matrix products run in Intel MKL (PyTorch's
CPU BLAS), which picks its kernels by the processor it finds: with the same seed, the same thread count and
the same libraries, MKL's AVX-512 and AVX2 code paths give different warm-up weights (measured for seed 0:
no-RL 28.5 / 12.1 at 1x / 4x on the AVX-512 path, 24.6 / 10.2 on the AVX2 path, 28.9 / 13.7 with
MKL_CBWR=COMPATIBLE; the thread count (1 or 2) and ATen's own AVX2 / AVX-512 kernels changed nothing).
MKL's conditional numerical reproducibility (the `MKL_CBWR` variable) fixes the code path: every processor
that has the named branch then computes the same bits. We name the widest branch the processor has
(AVX512, else AVX2), so every AVX-512 machine agrees with every other, and every AVX2-only machine with
every other; docs/demo.md gives the figures of both. A user's own `MKL_CBWR` is left alone.

`MKL_CBWR` is read when MKL first runs, so `pin_mkl_branch` must be called before any tensor work of the
process (the demo command calls it first; `--seeds` children inherit the variable).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, MutableMapping

log = logging.getLogger(__name__)


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The processor's feature flags (Linux /proc/cpuinfo); empty where they cannot be read."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_vendor(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The processor's vendor (`GenuineIntel`, `AuthenticAMD`, ...; Linux /proc/cpuinfo), None where unknown.
    MKL's `MKL_CBWR` branches are Intel's: on an AMD processor the same setting was measured to give the same bits
    for AVX2 and AVX512 (bench/results/demo_seed0_amd_epyc.json: another warm-up than either Intel branch)."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return None


def mkl_branch(flags: set[str]) -> str | None:
    """The MKL_CBWR branch for a processor with these flags: AVX512, AVX2, or None (leave MKL's choice)."""
    if "avx512f" in flags:
        return "AVX512"
    if "avx2" in flags:
        return "AVX2"
    return None


# the values MKL reads (Intel's documentation of MKL_CBWR): a branch, optionally ",STRICT"; anything else is
# ignored by MKL without a word, and the numerics are then MKL's own choice, not pinned
MKL_BRANCHES = ("AUTO", "COMPATIBLE", "SSE2", "SSE3", "SSSE3", "SSE4_1", "SSE4_2", "AVX", "AVX2", "AVX512",
                "AVX512_MIC", "AVX512_E1", "AVX512_MIC_E1")


def known_branch(value: str) -> bool:
    """Whether MKL reads `value` as a branch ("AVX2", "avx512,strict"); MKL ignores any other value."""
    branch, _, strict = value.strip().upper().partition(",")
    return branch in MKL_BRANCHES and strict in ("", "STRICT")


def pin_mkl_branch(environ: MutableMapping[str, str] = os.environ, flags: set[str] | None = None) -> str | None:
    """Set MKL_CBWR to this processor's widest branch unless the user set it; returns the branch in force. A
    user's value MKL does not know (`MKL_CBWR=garbage`) is left, with a warning: MKL ignores it silently, so
    the numerics are not pinned and the table may differ from docs/demo.md."""
    if environ.get("MKL_CBWR"):
        if not known_branch(environ["MKL_CBWR"]):
            log.warning("MKL_CBWR=%r is not a branch MKL knows (%s, optionally ',STRICT'): MKL ignores it, so the "
                        "demo's numerics are not pinned and its table may differ from docs/demo.md; unset it "
                        "(the demo then pins this processor's branch) or give one of those",
                        environ["MKL_CBWR"], ", ".join(MKL_BRANCHES))
        return environ["MKL_CBWR"]
    branch = mkl_branch(cpu_flags() if flags is None else flags)
    if branch is not None:
        environ["MKL_CBWR"] = branch
    return branch


def numerics() -> dict[str, Any]:
    """What decides the demo's float sums, for results.json: MKL branch, ATen kernels, threads, versions."""
    import torch  # lazy: torch
    import transformers  # lazy: transformers

    return {"mkl_cbwr": os.environ.get("MKL_CBWR"), "cpu_vendor": cpu_vendor(), "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__}
