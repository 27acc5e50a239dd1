"""Run `memagent serve`'s app on a free loopback port: in a thread (over an in-process backend) or as
a `memagent serve` subprocess (to kill it)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from memagent.config import AgentConfig

SMALL = dict(chunk_tokens=16, memory_tokens=8, answer_tokens=8, query_tokens=64)


def wait_done(url: str, job: str, timeout: float = 60.0, poll: float = 0.02) -> dict:
    """GET /v1/jobs/{job} until it is no longer queued or running; its view (AssertionError after `timeout` s)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        view = httpx.get(f"{url}/v1/jobs/{job}").json()
        if view["state"] not in ("queued", "running"):
            return view
        time.sleep(poll)
    raise AssertionError(f"job {job} did not finish")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def words(n: int, seed: int = 0) -> str:
    """A document of `n` words from a fixed vocabulary (deterministic)."""
    vocab = "river city album song band memory village county founded written music team war".split()
    return " ".join(f"{vocab[(i * 7 + seed) % len(vocab)]}{(i * 31 + seed) % 97}" for i in range(n))


class ThreadServer:
    """uvicorn in a daemon thread over `build(...)`; `.url`, `.manager`; stop() on exit."""

    def __init__(self, backend, state_dir: Path, key: str | None = None, serialize: bool = True, **limits):
        import uvicorn

        from memagent.serve.main import ServeOptions, build

        self.port = free_port()
        o = ServeOptions(model="tiny", port=self.port, state_dir=state_dir, **limits)
        self.app, self.manager = build(o, backend, AgentConfig(**SMALL), key, serialize=serialize)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port,
                                                    log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "ThreadServer":
        self.thread.start()
        wait_up(self.url)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.manager.shutdown()
        self.manager.store.close()


def wait_up(url: str, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"server at {url} did not come up in {timeout}s")


def start_subprocess(model_dir: Path, state_dir: Path, port: int) -> subprocess.Popen:
    """`memagent serve` over the tiny model, as a child process (stderr piped)."""
    src = Path(__file__).resolve().parents[2] / "src"
    env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "memagent.cli", "serve", "--model", str(model_dir), "--state-dir", str(state_dir),
           "--port", str(port), "--device", "cpu", "--dtype", "float32", "--max-jobs", "1"]
    cmd += [x for k, v in SMALL.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
