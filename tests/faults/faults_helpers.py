"""Helpers of the fault suite: subprocess limits (a full disk, a read-only folder even for root) and
record comparison without wall-clock fields."""
from __future__ import annotations

import ctypes
import os
import resource
import signal
from pathlib import Path
from typing import Any, Callable

import pytest

SRC = Path(__file__).parents[2] / "src"
TIMING_KEYS = {"rollout_s", "update_s", "step_s", "tokens_per_s", "seconds", "timing"}


def strip_timing(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records without the keys that measure wall-clock time (they differ between equal runs)."""
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def limited(max_file_bytes: int) -> Callable[[], None]:
    """A preexec_fn: no file this process writes may exceed `max_file_bytes` (a full disk, as the
    program sees it: a write past the limit fails with EFBIG, SIGXFSZ being ignored)."""
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # inherited across exec
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))
    return apply


def read_only_runner() -> Callable[[], None] | None:
    """A preexec_fn under which folder permissions hold: as root, the capabilities that bypass
    them (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH) are dropped from the child's bounding set, so the
    exec'd program runs without them. Skips the test where that cannot be done."""
    if os.name != "posix":
        pytest.skip("POSIX permissions only")
    if os.geteuid() != 0:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        pytest.skip("cannot drop root's capabilities here")

    def apply() -> None:
        for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
            if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                os._exit(97)
    return apply
