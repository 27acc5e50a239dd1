"""`memagent eval` under faults, in a subprocess: kill -9 mid-run, a full disk, a read-only --out.

A resumed sweep must hold exactly the records of an uninterrupted one (wall-clock fields aside),
and nothing finished before the fault may be lost.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faults_helpers import SRC, limited, read_only_runner, strip_timing

try:  # the CLI's mapping of OS errors (disk full, permission denied) to one error line comes with memagent.io
    import memagent.io  # noqa: F401
    OS_ERRORS_MAPPED = True
except ImportError:
    OS_ERRORS_MAPPED = False
needs_os_error_mapping = pytest.mark.skipif(not OS_ERRORS_MAPPED, reason="needs the CLI's OS-error mapping (memagent.io)")


@pytest.fixture(scope="module")
def data_file(hotpot_file, tmp_path_factory):
    from memagent.tasks.corpora import load_hotpotqa
    from memagent.tasks.ruler_hqa import synthesize_ruler_hqa
    from memagent.tasks.schema import write_samples

    path = tmp_path_factory.mktemp("evaldata") / "hqa.jsonl"
    write_samples(synthesize_ruler_hqa(load_hotpotqa(hotpot_file), samples=2, seed=0, num_docs=[3, 6]), path)
    return path


def eval_cmd(model: Path, data: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "memagent.cli", "eval", "--model", str(model), "--data", str(data), "--out", str(out),
            "--methods", "memagent", "--chunk-tokens", "96", "--memory-tokens", "8", "--answer-tokens", "8",
            "--query-tokens", "64", "--window", "160", "--batch-docs", "1", "--device", "cpu", "--no-progress"]


def env():
    return dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")


def records(out: Path) -> list[dict]:
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines() if x.strip()]
    return sorted(strip_timing(rows), key=lambda r: r["key"])


@pytest.fixture(scope="module")
def whole(tiny_model_dir, data_file, tmp_path_factory):
    """The uninterrupted sweep's records."""
    out = tmp_path_factory.mktemp("whole")
    p = subprocess.run(eval_cmd(tiny_model_dir, data_file, out), env=env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = records(out)
    assert len(got) == 4
    return got


def one_error_line(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 2, p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), p.stderr[-3000:]
    return last


@pytest.mark.slow
def test_kill_9_mid_eval_then_resume_equals_an_uninterrupted_sweep(tiny_model_dir, data_file, whole, tmp_path):
    out = tmp_path / "killed"
    proc = subprocess.Popen(eval_cmd(tiny_model_dir, data_file, out), env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    results, deadline = out / "results.jsonl", time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        if results.exists() and results.read_bytes().count(b"\n") >= 1:
            break
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the sweep ended before it could be killed"
    done = [json.loads(x) for x in results.read_text().splitlines() if x.strip() and x.endswith("}")]
    assert 1 <= len(done) < 4
    p = subprocess.run(eval_cmd(tiny_model_dir, data_file, out), env=env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert records(out) == whole
    kept = [json.loads(x) for x in results.read_text().splitlines()][:len(done)]
    assert kept == done  # what was finished before the kill is still there, untouched


@pytest.mark.slow
@needs_os_error_mapping
def test_full_disk_mid_eval_then_resume_loses_nothing(tiny_model_dir, data_file, whole, tmp_path):
    """A file-size limit that results.jsonl outgrows after a few records (EFBIG); then a resume without it."""
    out = tmp_path / "full"
    from memagent.protocol.profile import dump_profile, make_profile, resolve_values

    size = len((json.dumps(whole[0]) + "\n").encode()) + 200  # one record and part of a second
    # profile.yaml is written first and must fit (the run's settings are saved before any model call)
    profile = make_profile(*resolve_values(None, chunk_tokens=96, memory_tokens=8, answer_tokens=8, query_tokens=64,
                                           window=160))
    size = max(size, len(dump_profile(profile).encode()) + 1)
    p = subprocess.run(eval_cmd(tiny_model_dir, data_file, out), env=env(), capture_output=True, text=True,
                       timeout=300, preexec_fn=limited(size))
    assert "too large" in one_error_line(p).lower()
    before = [x for x in (out / "results.jsonl").read_text().splitlines()]
    p = subprocess.run(eval_cmd(tiny_model_dir, data_file, out), env=env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert records(out) == whole
    after = (out / "results.jsonl").read_text().splitlines()
    complete = [x for x in before if x.endswith("}")]
    assert len(complete) >= 1 and after[:len(complete)] == complete  # the finished records were kept


@pytest.mark.slow
@needs_os_error_mapping
def test_read_only_out_folder_is_one_error_line(tiny_model_dir, data_file, tmp_path):
    parent = tmp_path / "locked"
    parent.mkdir()
    parent.chmod(0o555)
    p = subprocess.run(eval_cmd(tiny_model_dir, data_file, parent / "out"), env=env(), capture_output=True,
                       text=True, timeout=300, preexec_fn=read_only_runner())
    line = one_error_line(p)
    assert "permission" in line.lower(), line
