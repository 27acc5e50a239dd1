"""Issue 37, class 4: the chunk index (SQLite FTS5, `memagent.documents.index`) under faults.

- A full disk while indexing was an `sqlite3.OperationalError` traceback: now one `error:` line naming the
  folder, exit 2, the partial index removed. The disk is a real full disk: a 1 MiB tmpfs mounted for the test
  (root only; skipped elsewhere), made the temporary folder.
- kill -9 while indexing left its `memagent-index-*` folder for ever: now the next run that makes a temporary
  index removes the folders whose owner died, and only those (a live run's folder, a folder without an owner
  lock, another user's are left).
"""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from tmpfs import mounted_tmpfs

from memagent.documents import index as index_mod
from memagent.agent.chunking import Chunk
from memagent.documents.index import TEMP_PREFIX, ChunkIndex
from memagent.lock import OWNER_NAME

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (a real full disk once 1 MiB is written), unmounted after the test."""
    yield from mounted_tmpfs(tmp_path, "1m")


def test_full_disk_while_indexing_is_one_line(run_cli, tiny_model_dir, tmp_path, small_disk, monkeypatch):
    doc = tmp_path / "doc.txt"
    doc.write_text(" ".join(f"river{i % 997} city{i % 991} bridge{i % 983}" for i in range(60_000)))  # ~1 MB
    before = hashlib.sha256(doc.read_bytes()).hexdigest()
    monkeypatch.setattr(tempfile, "tempdir", str(small_disk))
    code, out, err = run_cli("ask", "--model", tiny_model_dir, "--document", doc, "--question", "Which river?",
                             "--workflow", "skim", "--chunk-tokens", "512", "--device", "cpu", "--no-progress")
    assert code == 2, err[-3000:]
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err[-3000:]
    assert err.startswith(f"error: cannot write the chunk index in {small_disk}/{TEMP_PREFIX}")
    assert "no space left on the device" in err
    assert list(small_disk.iterdir()) == []  # the partial index removed
    assert hashlib.sha256(doc.read_bytes()).hexdigest() == before


def _chunk(i: int) -> Chunk:
    return Chunk(i, f"river{i} city bridge", [i, i + 1, i + 2], 3 * i)


HOLDER = """
import sys, time
sys.path.insert(0, {src!r})
import tempfile
tempfile.tempdir = {tmp!r}
from memagent.agent.chunking import Chunk
from memagent.documents.index import ChunkIndex
ix = ChunkIndex()
for i in range(50):
    ix.add(Chunk(i, "river city " * 50, list(range(10)), 10 * i))
print(ix.folder, flush=True)
time.sleep(600)
"""


def _holder(tmp: Path) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER.format(src=str(SRC), tmp=str(tmp))], stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    line = proc.stdout.readline().strip()
    assert line, "the holder process did not start its index"
    return proc, Path(line)


def test_a_killed_runs_index_folder_is_removed_by_the_next_run(tmp_path, monkeypatch):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    killed, dead_folder = _holder(tmp)
    alive, live_folder = _holder(tmp)
    try:
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(30)
        no_lock = tmp / f"{TEMP_PREFIX}old"  # an older memagent's folder (no owner lock): never touched
        no_lock.mkdir()
        (no_lock / "chunks.sqlite").write_bytes(b"x")
        assert (dead_folder / OWNER_NAME).is_file() and (dead_folder / "chunks.sqlite").is_file()

        monkeypatch.setattr(tempfile, "tempdir", str(tmp))
        monkeypatch.setattr(index_mod, "_swept", [])  # a new process: its first temp index sweeps
        with ChunkIndex() as ix:
            ix.add(_chunk(0))
            assert ix.folder.is_dir() and ix.folder != dead_folder
            mine = ix.folder
        assert not dead_folder.exists()  # the killed run's folder: removed
        assert live_folder.is_dir() and (live_folder / "chunks.sqlite").is_file()  # a live run's: kept
        assert no_lock.is_dir()
        assert not mine.exists()
    finally:
        alive.kill()
        alive.wait(30)


def test_kept_and_given_folders_are_never_swept(tmp_path, monkeypatch):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    kept = ChunkIndex(keep=True)
    kept.add(_chunk(0))
    kept.close()
    assert not (kept.folder / OWNER_NAME).exists()  # kept on purpose: its lock file is gone, no sweep removes it
    monkeypatch.setattr(index_mod, "_swept", [])
    with ChunkIndex() as ix:
        ix.add(_chunk(1))
    assert kept.path.is_file()
    with ChunkIndex(kept.folder, name="again.sqlite") as again:
        assert not (kept.folder / OWNER_NAME).exists() and again.path.parent == kept.folder
