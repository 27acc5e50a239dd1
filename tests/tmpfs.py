"""A real full disk for tests: a small tmpfs mounted under the test's folder (root only), unmounted afterwards."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest


def mounted_tmpfs(tmp_path: Path, size: str) -> Iterator[Path]:
    """Yield tmp_path/small, a tmpfs of `size` (mount's syntax: 100k, 1m); skip where it cannot be mounted."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
