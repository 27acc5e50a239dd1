"""`memagent serve`'s bad options and state, in the table style of test_bad_inputs.py: each exits 2 with exactly
one `error:` line and no traceback, before anything binds (uvicorn.run is replaced by a tripwire, and the port
is free afterwards), and every input (the world's files, the model, a state folder's database) is left as it
was. In process, through `memagent.cli.run`."""
from __future__ import annotations

import shutil
import socket
import sqlite3
from pathlib import Path

import pytest

from test_bad_inputs import _digests, world  # noqa: F401  (the fixture)

from memagent.cli import run

pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def serve_world(world, tiny_model_dir):  # noqa: F811
    """`world` plus what only the service reads: state folders with bad databases, a model without tokenizer,
    profiles the model's chat template cannot render."""
    w = world / "serve"
    w.mkdir()
    for name in ("garbage", "other", "newer"):
        (w / name).mkdir()
    (w / "garbage" / "serve.sqlite3").write_bytes(b"not a database at all " * 50)
    with sqlite3.connect(w / "other" / "serve.sqlite3") as db:
        db.execute("CREATE TABLE jobs (name TEXT, payload BLOB)")  # some other program's jobs table
    with sqlite3.connect(w / "newer" / "serve.sqlite3") as db:
        db.execute("PRAGMA user_version = 7")
    shutil.copytree(tiny_model_dir, w / "notok")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (w / "notok" / f).unlink()
    (w / "ctk.yaml").write_text("chat_template_kwargs: {tokenize: true}\n")
    (w / "ctk_agp.yaml").write_text("chat_template_kwargs: {add_generation_prompt: false}\n")
    (w / "seed.yaml").write_text("sampling: {seed: -1}\n")
    return w


SERVE = ["serve", "--model", "{m}", "--device", "cpu", "--state-dir", "{w}/serve/state", "--port", "{port}"]

CASES = [
    # counts and sizes: each rule is beside its option (ServeOptions)
    ("serve-max-jobs-0", [*SERVE, "--max-jobs", "0"], "--max-jobs must be in 1..1024, got 0"),
    ("serve-max-jobs-huge", [*SERVE, "--max-jobs", "100000"], "--max-jobs must be in 1..1024"),
    ("serve-max-queue-neg", [*SERVE, "--max-queue", "-1"], "--max-queue must be in 0..1000000, got -1"),
    ("serve-max-body-0", [*SERVE, "--max-body-bytes", "0"], "--max-body-bytes must be in 1024.."),
    ("serve-max-body-huge", [*SERVE, "--max-body-bytes", str(1 << 40)], "--max-body-bytes must be in 1024.."),
    ("serve-max-document-neg", [*SERVE, "--max-document-bytes", "-1"], "--max-document-bytes must be >= 1"),
    ("serve-max-document-0", [*SERVE, "--max-document-bytes", "0"], "--max-document-bytes must be >= 1"),
    ("serve-max-question-0", [*SERVE, "--max-question-chars", "0"], "--max-question-chars must be in 1.."),
    # the model: budgets, tokenizer, prompts
    ("serve-budget-over-window", [*SERVE, "--chunk-tokens", "100000"], "but the model's window is"),
    ("serve-no-tokenizer", [*SERVE, "--model", "{w}/serve/notok"], "has no vocabulary file"),
    ("serve-profile-ctk-tokenize", [*SERVE, "--profile", "{w}/serve/ctk.yaml"], "is an argument of apply_"),
    ("serve-profile-ctk-agp", [*SERVE, "--profile", "{w}/serve/ctk_agp.yaml"], "is an argument of apply_"),
    ("serve-profile-seed-neg", [*SERVE, "--profile", "{w}/serve/seed.yaml"], "sampling.seed must be in [0, 2**32)"),
    # the state folder's database
    ("serve-db-garbage", [*SERVE, "--state-dir", "{w}/serve/garbage"], "is not a memagent serve database"),
    ("serve-db-other-schema", [*SERVE, "--state-dir", "{w}/serve/other"], "another schema: its table 'jobs'"),
    ("serve-db-newer-version", [*SERVE, "--state-dir", "{w}/serve/newer"], "schema version 7"),
    # the upstream server's URL (--backend openai): refused when the command line is read
    ("serve-base-url-port", [*SERVE, "--backend", "openai", "--base-url", "http://127.0.0.1:99999/v1"],
     "Port out of range"),
    ("serve-base-url-ipv6", [*SERVE, "--backend", "openai", "--base-url", "http://[::1/v1"], "Invalid IPv6 URL"),
    ("serve-base-url-ipv6-bad-host", [*SERVE, "--backend", "openai", "--base-url", "http://[zz::1]:8000/v1"],
     "is not a valid URL"),
    ("serve-base-url-port-text", [*SERVE, "--backend", "openai", "--base-url", "http://h:80x/v1,http://g/v1"],
     "is not a valid URL"),
    ("ask-base-url-port", ["ask", "--backend", "openai", "--base-url", "http://127.0.0.1:65536/v1", "--model", "m",
                           "--document", "{w}/doc.txt", "--question", "q"], "Port out of range"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.parametrize("args, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_serve_input(args, message, serve_world, world, tiny_model_dir, capsys, monkeypatch):  # noqa: F811
    import uvicorn

    def tripwire(*_a, **_k):
        raise AssertionError("memagent serve started its server")

    monkeypatch.setattr(uvicorn, "run", tripwire)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    port = _free_port()
    before = _digests(world, Path(tiny_model_dir))
    argv = [a.replace("{w}", str(world)).replace("{m}", str(tiny_model_dir)).replace("{port}", str(port))
            for a in args]
    code = run(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    lines = [line for line in (out + err).splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], (out, err)
    assert "Traceback" not in out + err
    assert _bindable(port)
    after = _digests(world, Path(tiny_model_dir))
    assert {k: v for k, v in after.items() if k in before} == before  # inputs byte-identical
    new = sorted(set(after) - set(before))
    assert all("/serve/" in k and Path(k).name in (".memagent.lock", "serve.sqlite3") for k in new), new


def test_the_table_covers_every_service_option_rule():
    from memagent.serve.main import ServeOptions
    import dataclasses

    bounded = {f.name.replace("_", "-") for f in dataclasses.fields(ServeOptions) if "why" in f.metadata}
    tried = {a.lstrip("-") for c in CASES for a in c[1] if a.startswith("--max-")}
    assert bounded - {"port"} <= tried


def test_a_zero_byte_database_is_a_new_one(tmp_path, tiny_backend):
    """SQLite's own rule, kept: an empty file holds nothing to lose, so the service starts on it."""
    from memagent.serve.store import Store

    (tmp_path / "serve.sqlite3").write_bytes(b"")
    store = Store(tmp_path / "serve.sqlite3")
    store.add_job("job_" + "a" * 32, "doc_" + "0" * 32, ["q?"])
    assert store.job("job_" + "a" * 32)["state"] == "queued"
    store.close()
