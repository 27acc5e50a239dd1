"""A hostile OpenAI-shaped server on 127.0.0.1: it echoes our Authorization header back (cut at a length
limit, upper-cased, split by spaces, in an error, a 5xx, a wrong-typed field, the answer itself), sends JSON
nested too deep, a lone surrogate, an endless body; and replicas of which one is dead. Each ends in a correct
result or one clear BackendError, and no piece of the key appears in any message or output."""
from __future__ import annotations

import json
import re
import socket
import threading
import time

import pytest

from loopback_http import LoopbackServer, Reply

from memagent.backends.base import BackendError, SamplingParams
from memagent.backends.openai import OpenAIBackend

KEY = "sk-PROBE-9f3kQ7xZ-SECRET-4d2aW8"
PIECES = ("probe", "9f3k", "secret", "4d2a")  # any of these, in any case, is (part of) the key


def leaks(text: str) -> list[str]:
    """The pieces of the key in `text`, looked for as written and with every non-alphanumeric dropped."""
    low = str(text).lower()
    bare = re.sub(r"[\W_]", "", low)
    return [p for p in PIECES if p in low or p in bare] + (["sk-p"] if "sk-p" in low else [])


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


class Hostile(LoopbackServer):
    """Answers every request as `mode` says; `echo(auth)` is what it sends back of the header."""

    def __init__(self, mode: str, echo=lambda auth: auth) -> None:
        super().__init__()
        self.mode, self.echo = mode, echo

    def handle(self, method, path, headers, body):
        said = self.echo(headers.get("Authorization") or "")
        if self.mode == "401":
            return Reply(401, json.dumps({"error": {"message": said}}).encode())
        if self.mode == "500":
            return Reply(500, json.dumps({"error": {"message": said}}).encode())
        if self.mode == "answer":  # the "model" answers with the header
            return Reply(200, json.dumps(_reply(f"the answer is \\boxed{{{said}}}")).encode())
        if self.mode == "wrong-type":  # content a list holding the header: the type error shows the value
            return Reply(200, json.dumps({"choices": [{"message": {"content": [said]}}]}).encode())
        if self.mode == "deep":
            return Reply(200, b'{"choices": ' + b"[" * 50_000 + b"]" * 50_000 + b"}")
        if self.mode == "deep-500":
            return Reply(500, b"[" * 100_000 + b"]" * 100_000)
        if self.mode == "deep-small":  # under the recursion limit, over our depth
            return Reply(200, json.dumps(_reply("x", extra=_nest(200))).encode())
        if self.mode == "surrogate":
            return Reply(200, json.dumps(_reply("a")).replace('"a"', '"a\\ud800b"').encode())
        raise AssertionError(self.mode)


def _reply(content: str, extra=None) -> dict:
    out = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}
    if extra is not None:
        out["extra"] = extra
    return out


def _nest(n: int):
    v: list = []
    for _ in range(n):
        v = [v]
    return v


def make(url: str, tokenizer, **kw) -> OpenAIBackend:
    return OpenAIBackend(**dict(dict(model="tiny", base_url=url, tokenizer=tokenizer, timeout=5.0, backoff=0.01,
                                     max_retries=1, retry_seed=0, check_server=False), **kw))


def generate_error(server: LoopbackServer, tiny_tokenizer) -> BackendError:
    b = make(server.url, tiny_tokenizer)
    try:
        with pytest.raises(BackendError) as e:
            b.generate(["hello"], SamplingParams(4))
    finally:
        b.close()
    return e.value


@pytest.mark.parametrize("pad", [255, 262, 270, 276, 279])
def test_an_echo_cut_at_the_length_limit_shows_no_piece_of_the_key(pad, tiny_tokenizer):
    """The body's message is cut at 300 characters; padded so the cut falls inside the key of `Bearer KEY`
    (which starts at pad + 17): 28 down to 4 of its characters before the cut."""
    with Hostile("401", echo=lambda auth: "x" * pad + " you sent " + auth).start() as s:
        err = generate_error(s, tiny_tokenizer)
    assert "HTTP 401" in str(err) and not leaks(str(err)), str(err)


@pytest.mark.parametrize("echo", [
    lambda auth: "bad key " + auth.upper(),  # BEARER SK-PROBE-...
    lambda auth: "bad key " + auth.lower(),
    lambda auth: "bad key " + auth.replace("-", " "),  # sk PROBE 9f3kQ7xZ SECRET ...
    lambda auth: "bad key " + " ".join(auth.split(" ")[1]),  # s k - P R O B E ...
    lambda auth: "bad key " + auth.split(" ")[1][:9] + "...",  # a prefix of it the server cut itself
    lambda auth: "key=" + auth.split(" ")[1].replace("-", "\n"),  # split over lines
], ids=["upper", "lower", "spaced", "letter-spaced", "prefix", "lines"])
def test_an_echo_in_another_case_or_spacing_shows_no_piece_of_the_key(echo, tiny_tokenizer):
    with Hostile("401", echo=echo).start() as s:
        err = generate_error(s, tiny_tokenizer)
    assert not leaks(str(err)), str(err)


def test_an_echo_in_a_retried_5xx_and_in_a_wrong_typed_field_shows_nothing(tiny_tokenizer):
    with Hostile("500", echo=lambda auth: "upstream said " + auth.upper()).start() as s:
        err = generate_error(s, tiny_tokenizer)
    assert "failed all 2 tries" in str(err) and not leaks(str(err)), str(err)
    with Hostile("wrong-type").start() as s:
        err = generate_error(s, tiny_tokenizer)
    assert "choices[0].message.content" in str(err) and not leaks(str(err)), str(err)


def test_an_answer_that_echoes_the_key_is_redacted(tiny_tokenizer):
    with Hostile("answer", echo=lambda auth: auth.split(" ")[1].upper()).start() as s:
        b = make(s.url, tiny_tokenizer)
        try:
            text = b.generate(["hello"], SamplingParams(4))[0].text
        finally:
            b.close()
    assert text == "the answer is \\boxed{***}"


def test_the_cli_error_line_shows_no_piece_of_the_key(tiny_model_dir, tmp_path, capsys):
    from memagent.cli import run

    doc = tmp_path / "d.txt"
    doc.write_text("a short document " * 5)
    with Hostile("401", echo=lambda auth: "y" * 260 + " got " + auth).start() as s:  # the cut: in the key
        code = run(["ask", "--backend", "openai", "--base-url", s.url, "--model", "tiny", "--tokenizer",
                    str(tiny_model_dir), "--document", str(doc), "--question", "q", "--no-progress",
                    "--max-retries", "0"])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("error:") == 1 and "HTTP 401" in err, err
    assert not leaks(out + err), err


@pytest.mark.parametrize("mode, words", [
    ("deep", "nested more than 64 levels"),
    ("deep-small", "nested more than 64 levels"),
    ("surrogate", "a lone surrogate U+D800"),
])
def test_a_reply_too_deep_or_with_a_lone_surrogate_is_one_clear_error(mode, words, tiny_tokenizer):
    with Hostile(mode).start() as s:
        err = generate_error(s, tiny_tokenizer)
    assert words in str(err) and s.url in str(err), str(err)


def test_a_deep_error_body_is_shown_as_text_not_a_crash(tiny_tokenizer):
    with Hostile("deep-500").start() as s:
        err = generate_error(s, tiny_tokenizer)
    assert "failed all 2 tries (last: HTTP 500: [[[" in str(err)


def _raw_server(reply_head: bytes, endless: bool):
    """A socket server that answers one request with `reply_head`, then (endless) `a` bytes until cut off."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            try:
                c.recv(65536)
                c.sendall(reply_head)
                while endless:
                    c.sendall(b"a" * 65536)
            except OSError:
                pass
            finally:
                c.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.getsockname()[1]}/v1"


@pytest.mark.parametrize("head, endless", [
    (b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"choices": [{"text": "', True),
    (b"HTTP/1.1 500 Oops\r\nContent-Type: text/plain\r\n\r\n", True),  # an endless error body
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n{", False),  # declared, never sent
])
def test_an_endless_or_huge_reply_is_cut_at_the_byte_limit(head, endless, tiny_tokenizer):
    import resource

    srv, url = _raw_server(head, endless)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    try:
        err = generate_error(type("S", (), {"url": url})(), tiny_tokenizer)
    finally:
        srv.close()
    assert "sent a reply of" in str(err) and "33554432 bytes allowed" in str(err), str(err)
    assert time.perf_counter() - t0 < 4.0  # not the 5 s deadline: the cap, not the clock, stopped it
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 400_000  # KiB: bounded by the 32 MiB cap


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def _hanging_server():
    """Accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    return srv, f"http://127.0.0.1:{srv.getsockname()[1]}/v1"


@pytest.mark.parametrize("dead_kind", ["refused", "hanging"])
@pytest.mark.parametrize("order", ["good,dead", "dead,good"])
def test_one_dead_replica_at_start_the_live_one_is_used(order, dead_kind, openai_server, tiny_model_dir, caplog):
    """With the default back-off (1 s, 4 retries) a dead replica held the start for its retries (about 10 s
    refused, minutes hanging); now it is asked once within the connect timeout and the start goes on."""
    srv, dead = _hanging_server() if dead_kind == "hanging" else (None, _dead_url())
    urls = order.replace("good", openai_server.url).replace("dead", dead)
    t0 = time.perf_counter()
    try:
        b = OpenAIBackend("tiny", urls, tiny_model_dir, timeout=30.0, connect_timeout=1.5)
        started = time.perf_counter() - t0
        out = b.generate(["a", "b", "c"], SamplingParams(4))
        b.close()
    finally:
        if srv is not None:
            srv.close()
    assert started < 3.0, started
    assert len(out) == 3 and all(g.token_ids for g in out)
    assert b.max_window == openai_server.max_model_len  # the live replica's window
    assert any("going on with the other replicas" in r.message for r in caplog.records)


@pytest.mark.parametrize("url, words", [
    ("http://127.0.0.1:99999/v1", "Port out of range"),
    ("http://127.0.0.1:0/v1", "port 0"),
    ("http://[::1/v1", "Invalid IPv6 URL"),
    ("http://[not-v6]:8000/v1", "is not a valid URL"),
    ("http://user:pw-SECRET-x@127.0.0.1:99999/v1", "Port out of range"),
])
def test_a_base_url_that_does_not_parse_is_one_clear_error(url, words, tiny_tokenizer, monkeypatch):
    with pytest.raises(BackendError) as e:
        make(url, tiny_tokenizer)
    assert words in str(e.value) and "pw-SECRET" not in str(e.value), str(e.value)
    monkeypatch.setenv("OPENAI_BASE_URL", url)  # the same through the environment
    with pytest.raises(BackendError):
        OpenAIBackend("tiny", None, tiny_tokenizer, check_server=False)


# -- issue 37, class 7: the key, encoded ------------------------------------------------------------------------
def encoded_leaks(text: str) -> list[str]:
    """The pieces of the key in `text` once every run that may be an encoding is decoded: base64 (both
    alphabets, read from each of its first 4 characters, so at every offset), hex, percent-encoding."""
    import base64
    import binascii
    from urllib.parse import unquote

    found = set(leaks(text)) | set(leaks(unquote(text)))
    for run in re.findall(r"[A-Za-z0-9+/_-]{8,}", text):
        for start in range(4):
            piece = run[start:].translate(str.maketrans("-_", "+/"))
            piece = piece[: len(piece) - len(piece) % 4]
            try:
                found |= set(leaks(base64.b64decode(piece).decode("latin-1")))
            except (binascii.Error, ValueError):
                pass
    for run in re.findall(r"[0-9a-fA-F]{8,}", text):
        for start in range(2):
            piece = run[start:]
            found |= set(leaks(bytes.fromhex(piece[: len(piece) - len(piece) % 2]).decode("latin-1")))
    return sorted(found)


def _b64(auth: str) -> str:
    import base64

    return base64.b64encode(auth.encode()).decode()


def _b64url(auth: str) -> str:
    import base64

    return base64.urlsafe_b64encode(auth.encode()).decode().rstrip("=")


def _every_byte(auth: str) -> str:
    return "".join(f"%{b:02X}" for b in auth.encode())


@pytest.mark.parametrize("echo", [
    lambda auth: "you sent " + _b64(auth),  # base64 of `Bearer KEY`
    lambda auth: "you sent " + _b64(auth.split(" ")[1]),  # base64 of the key alone
    lambda auth: "headers: " + _b64("Authorization: " + auth + "\r\nHost: x"),  # the key at another offset
    lambda auth: "you sent " + _b64url("x" + auth),  # URL-safe alphabet, unpadded, offset 1
    lambda auth: "you sent " + _b64url("xy" + auth.split(" ")[1]),  # offset 2
    lambda auth: "you sent " + auth.encode().hex(),
    lambda auth: "you sent " + auth.encode().hex().upper(),
    lambda auth: "you sent " + auth.split(" ")[1].encode().hex(),
    lambda auth: "you sent " + __import__("urllib.parse").parse.quote(auth),
    lambda auth: "you sent " + __import__("urllib.parse").parse.quote_plus(auth),
    lambda auth: "you sent " + _every_byte(auth),
    lambda auth: "you sent " + _every_byte(auth).lower()[:60] + "...",  # cut by the server
    lambda auth: "you sent " + _b64(auth)[:30] + "...",  # cut by the server, inside the key
    lambda auth: "x" * 250 + " you sent " + _b64(auth),  # cut by the 300-character limit, inside the key
], ids=["b64-header", "b64-key", "b64-offset", "b64url-1", "b64url-2", "hex", "HEX", "hex-key", "quote",
        "quote-plus", "all-%XX", "all-%xx-cut", "b64-cut", "b64-limit-cut"])
def test_an_encoded_echo_shows_no_piece_of_the_key(echo, tiny_tokenizer):
    assert encoded_leaks(echo(f"Bearer {KEY}"))  # the oracle sees the key in the echo itself
    with Hostile("401", echo=echo).start() as s:
        err = generate_error(s, tiny_tokenizer)
    assert "HTTP 401" in str(err) and not encoded_leaks(str(err)), str(err)


def test_the_cli_error_line_shows_no_encoded_key(tiny_model_dir, tmp_path, capsys):
    from memagent.cli import run

    doc = tmp_path / "d.txt"
    doc.write_text("a short document " * 5)
    with Hostile("401", echo=lambda auth: "got " + _b64(auth) + " and " + auth.encode().hex()).start() as s:
        code = run(["ask", "--backend", "openai", "--base-url", s.url, "--model", "tiny", "--tokenizer",
                    str(tiny_model_dir), "--document", str(doc), "--question", "q", "--no-progress",
                    "--max-retries", "0"])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("error:") == 1 and "HTTP 401" in err, err
    assert not encoded_leaks(out + err), err


def test_encodings_of_other_text_are_left_alone():
    import base64

    from memagent.backends.redact import redact

    other = "Bearer sk-another-key-entirely-123"
    text = f"id {base64.b64encode(other.encode()).decode()} hash {other.encode().hex()} url a%20b%2Fc"
    assert redact(text, KEY, bearer=False) == text
