"""Bad input and faults of streams: each a one-line `error:` and exit code 2, nothing appended lost."""
from __future__ import annotations

import io
import sqlite3
import sys

import pytest

from memagent.streams import Stream, StreamError
from memagent.streams.store import StreamFile


def _stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def _one_line_error(code: int, err: str, *words: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    for w in words:
        assert w in lines[0], lines[0]


def _texts(path) -> list[str]:
    with Stream.open(path) as s:
        return [e.text for e in s.events()]


def test_event_over_the_limit_keeps_the_events_before_it(tmp_path, run_cli, monkeypatch):
    s = tmp_path / "s.db"
    run_cli("stream", "create", s, "--max-event-bytes", "10")
    for n, long in enumerate((b"x" * 11, b"y" * 100_000), 1):  # just over; far over (not read whole)
        _stdin(monkeypatch, b"short\n" + long + b"\nnever\n")
        code, _, err = run_cli("stream", "append", s)
        _one_line_error(code, err, "limit of 10 bytes", f"appended event {n} before it, and kept")
    assert _texts(s) == ["short", "short"]
    with Stream.open(s) as st, pytest.raises(StreamError, match="over the stream's limit of 10 bytes"):
        st.append("é" * 6)  # 12 bytes in UTF-8


@pytest.mark.parametrize("bad", ["yesterday", "2026-13-01", "2026-01-01T25:00", "", "1e9"])
def test_bad_time_is_refused(tmp_path, run_cli, monkeypatch, bad):
    s = tmp_path / "s.db"
    run_cli("stream", "create", s)
    _stdin(monkeypatch, b"hello\n")
    _one_line_error(*run_cli("stream", "append", s, "--time", bad)[::2], "bad time")
    assert _texts(s) == []


@pytest.mark.parametrize("bad", ['{"text": 3}', '{"text": "a", "when": 1}', '[1]', '{"text": "a", "role": "a b"}',
                                 '{"text": "a", "time": "noon"}', '{"text": "a\\u0000b"}', '{"text": "\\ud800"}'])
def test_bad_jsonl_events_are_refused(tmp_path, run_cli, monkeypatch, bad):
    s = tmp_path / "s.db"
    run_cli("stream", "create", s)
    _stdin(monkeypatch, b'{"text": "ok"}\n' + bad.encode() + b"\n")
    _one_line_error(*run_cli("stream", "append", s, "--format", "jsonl")[::2], "appended event 1 before it")
    assert _texts(s) == ["ok"]


def test_missing_stream_and_files_that_are_not_streams(tmp_path, run_cli):
    q = ["--question", "q?", "--model", str(tmp_path / "no-model")]
    _one_line_error(*run_cli("stream", "ask", tmp_path / "none.db", *q)[::2], "no stream at", "stream create")
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all, just text" * 200)
    _one_line_error(*run_cli("stream", "show", garbage)[::2], "is not a memagent stream")
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE t (x)")
    _one_line_error(*run_cli("stream", "append", other, tmp_path / "x.txt")[::2], "SQLite database but not a "
                                                                                  "memagent stream")
    (tmp_path / "empty.db").write_bytes(b"")
    _one_line_error(*run_cli("stream", "show", tmp_path / "empty.db")[::2], "is empty")
    _one_line_error(*run_cli("stream", "create", garbage)[::2], "already exists")


def test_damaged_stream_is_one_line(tmp_path, run_cli):
    s = tmp_path / "s.db"
    with Stream.create(s) as st:
        st.append_many([{"text": f"event {i} " + "word " * 200} for i in range(200)])
    with sqlite3.connect(s) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(s.read_bytes())
    data[8192:40960] = b"\xa5" * (40960 - 8192)  # pages of the events table overwritten
    s.write_bytes(bytes(data))
    code, out, err = run_cli("stream", "show", s, "--events")
    _one_line_error(code, err, "is damaged")


def test_second_writer_is_refused_or_waits_never_interleaved(tmp_path, run_cli, monkeypatch):
    s = tmp_path / "s.db"
    run_cli("stream", "create", s)
    first = Stream.open(s)
    first.append("a1")
    _stdin(monkeypatch, b"b1\nb2\n")
    _one_line_error(*run_cli("stream", "append", s)[::2], "another process is appending", "--wait")
    _stdin(monkeypatch, b"b1\nb2\n")
    _one_line_error(*run_cli("stream", "append", s, "--wait", "0.3")[::2], "waited for 0.3 s")
    first.append("a2")
    first.close()  # the lock goes with it
    _stdin(monkeypatch, b"b1\nb2\n")
    assert run_cli("stream", "append", s, "--wait", "5")[0] == 0
    assert _texts(s) == ["a1", "a2", "b1", "b2"]


def test_full_disk_mid_append_keeps_what_was_there(tmp_path, run_cli, monkeypatch):
    """A full disk, simulated by SQLite's page limit: the event that does not fit is not written, one line."""
    s = tmp_path / "s.db"
    run_cli("stream", "create", s)
    opened = StreamFile._check

    def tight(self):
        opened(self)
        pages = self.db.execute("PRAGMA page_count").fetchone()[0]
        self.db.execute(f"PRAGMA max_page_count = {pages + 8}")

    monkeypatch.setattr(StreamFile, "_check", tight)
    _stdin(monkeypatch, b"".join(b"line %d " % i + b"filler " * 300 + b"\n" for i in range(40)))
    code, _, err = run_cli("stream", "append", s)
    _one_line_error(code, err, "no space left on the device while appending an event", "before it, and kept")
    monkeypatch.setattr(StreamFile, "_check", opened)
    kept = _texts(s)
    assert 0 < len(kept) < 40 and all(t.startswith(f"line {i} ") for i, t in enumerate(kept))
    with Stream.open(s) as st:
        st.append("after the disk was freed")
    assert _texts(s)[-1] == "after the disk was freed"


def test_two_append_processes_one_refused_and_nothing_interleaved(tmp_path):
    import subprocess
    import time

    s = tmp_path / "s.db"
    Stream.create(s).close()
    cmd = [sys.executable, "-m", "memagent.cli", "stream", "append", str(s)]
    first = subprocess.Popen(cmd, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first.stdin.write(b"a1\n")
        first.stdin.flush()
        deadline = time.time() + 60
        while not _texts(s) and time.time() < deadline:  # the first holds the lock once its first line is in
            time.sleep(0.1)
        second = subprocess.run(cmd, input=b"b1\nb2\n", capture_output=True, timeout=60)
        _one_line_error(second.returncode, second.stderr.decode(), "another process is appending")
        first.stdin.write(b"a2\n")
        first.stdin.close()
        assert first.wait(60) == 0
    finally:
        first.kill()
    later = subprocess.run(cmd, input=b"b1\nb2\n", capture_output=True, timeout=60)
    assert later.returncode == 0
    assert _texts(s) == ["a1", "a2", "b1", "b2"]
