"""Outputs that are devices, FIFOs or symlinks (issue 24, classes 4 and 14): a sink is written in place and never
replaced by a regular file, with no side files or locks beside it; a full device is one `error:` line; a block
device is refused. The device nodes are made here with `os.mknod` in a temporary folder (root only), never the
system's /dev: (1, 3) is the kernel's null device, (1, 7) its full device (every write: ENOSPC)."""
from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from memagent.cli import run

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")


def _node(path: Path, minor: int, kind: int = stat.S_IFCHR, major: int = 1) -> Path:
    os.mknod(path, kind | 0o666, os.makedev(major, minor))
    return path


@pytest.fixture
def dev(tmp_path):
    """A folder with a null device, a full device and a symlink to the null device."""
    d = tmp_path / "dev"
    d.mkdir()
    _node(d / "null", 3)
    _node(d / "full", 7)
    (d / "link").symlink_to(d / "null")
    return d


def _is_chr(path: Path) -> bool:
    return stat.S_ISCHR(os.stat(path).st_mode)


TOY = ["data", "toy", "--chunks", "2", "--samples", "2"]


def test_data_out_null_device_is_written_in_place(dev, capsys):
    assert run([*TOY, "--out", str(dev / "null")]) == 0
    assert _is_chr(dev / "null") and sorted(p.name for p in dev.iterdir()) == ["full", "link", "null"]


def test_a_symlink_to_a_device_stays_a_symlink_to_it(dev, capsys):
    assert run([*TOY, "--out", str(dev / "link")]) == 0
    assert (dev / "link").is_symlink() and _is_chr(dev / "null") and _is_chr(dev / "link")
    assert sorted(p.name for p in dev.iterdir()) == ["full", "link", "null"]


def test_a_full_device_is_one_error_line_and_stays_a_device(dev, capsys):
    code = run([*TOY, "--out", str(dev / "full")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("error:") == 1 and "no space left on the device" in err, err
    assert str(dev / "full") in err and "Traceback" not in err
    assert _is_chr(dev / "full") and sorted(p.name for p in dev.iterdir()) == ["full", "link", "null"]


def test_a_block_device_is_refused_before_any_work(dev, capsys):
    _node(dev / "disk", 0, stat.S_IFBLK, major=7)  # a loop device node: never opened
    code = run([*TOY, "--out", str(dev / "disk")])
    err = capsys.readouterr().err
    assert code == 2 and "is a block device, not a file" in err, err
    assert stat.S_ISBLK(os.stat(dev / "disk").st_mode)


def _questions(tmp_path: Path) -> Path:
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"id": "a", "question": "who?", "context": "Ann wrote it."}) + "\n")
    return q


ASK_FLAGS = ["--chunk-tokens", "32", "--memory-tokens", "8", "--answer-tokens", "4", "--no-progress"]


def test_ask_output_null_device_gets_no_lock_or_profile_beside_it(dev, tmp_path, tiny_model_dir, capsys):
    _node(dev / "null2", 3)
    code = run(["ask", "--model", str(tiny_model_dir), "--input", str(_questions(tmp_path)), "--output",
                str(dev / "link"), "--trace", str(dev / "null2"), *ASK_FLAGS])
    assert code == 0, capsys.readouterr().err
    assert sorted(p.name for p in dev.iterdir()) == ["full", "link", "null", "null2"]  # no lock, no .profile.yaml
    assert _is_chr(dev / "null") and (dev / "link").is_symlink()


def test_ask_output_full_device_is_one_error_line(dev, tmp_path, tiny_model_dir, capsys):
    code = run(["ask", "--model", str(tiny_model_dir), "--input", str(_questions(tmp_path)), "--output",
                str(dev / "full"), *ASK_FLAGS])
    err = capsys.readouterr().err
    assert code == 2 and err.count("error:") == 1 and f"{dev / 'full'}: no space left" in err, err
    assert _is_chr(dev / "full")


def test_a_fifo_is_written_in_place(tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    code = run([*TOY, "--out", str(fifo)])
    reader.join(30)
    assert code == 0 and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert len(got[0].decode().splitlines()) == 2  # the two samples went through the pipe


def test_the_atomic_writers_never_replace_a_device_or_a_symlink(dev, tmp_path):
    from memagent.eval.records import atomic_write_lines
    from memagent.io import atomic_write_text

    atomic_write_lines(dev / "null", ["a\n"])  # the eval writer (fsync) and the io one are one writer
    atomic_write_text(dev / "link", "b")
    assert _is_chr(dev / "null") and (dev / "link").is_symlink()
    real = tmp_path / "real.txt"
    real.write_text("old")
    (tmp_path / "alias.txt").symlink_to(real)
    atomic_write_text(tmp_path / "alias.txt", "new")
    assert (tmp_path / "alias.txt").is_symlink() and real.read_text() == "new"
    with pytest.raises(OSError) as e:
        atomic_write_lines(dev / "full", ["x\n"])
    assert e.value.filename == str(dev / "full") and _is_chr(dev / "full")
