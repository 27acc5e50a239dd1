"""Issue 37, classes 5 and 6. Class 5: `memagent serve` reads request JSON with the CLI's bounds
(`memagent.bounded`): a body nested too deep, an integer of 5,000 digits and a lone surrogate in a question
or the document were HTTP 500; now each is a 400 naming what is wrong, nothing is stored, and the server goes on. Class 6: a host name that
does not resolve or a port in use exited 3 with uvicorn's own log line (after loading the model); now one
`error:` line and exit 2, before the state folder is made or the model loaded."""
from __future__ import annotations

import httpx
import pytest

pytest.importorskip("fastapi")

from serve_helpers import ThreadServer, words  # noqa: E402


@pytest.fixture
def server(tiny_backend, tmp_path):
    with ThreadServer(tiny_backend, tmp_path / "state", max_body_bytes=64_000) as s:
        yield s


DEEP = '{"document": "x", "questions": ["q?"], "extra": ' + "[" * 5000 + "]" * 5000 + "}"
LONG_INT = '{"document": "x", "questions": ["q?"], "seed": ' + "7" * 5000 + "}"


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/chat/completions"])
@pytest.mark.parametrize("body, expected", [
    (DEEP, "the request body: nested more than 64 levels deep"),
    (LONG_INT, "the request body: an integer of 5,000 digits, more than the 4,300 allowed"),
    ('{"document": "x", "questions": ["who \\ud800 is?"], "messages": [{"role": "user", "content": "a\\udfff"}]}',
     "holds text that is not valid UTF-8 (a lone surrogate"),
    ('{"document": "the \\udc80 river", "questions": ["q?"], "messages": [{"role": "system", "content": "\\ud800"}]}',
     "holds text that is not valid UTF-8 (a lone surrogate"),
])
def test_json_past_the_bounds_is_a_400(server, path, body, expected):
    resp = httpx.post(server.url + path, content=body.encode(), headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert expected in resp.json()["error"]["message"], resp.text
    assert httpx.get(server.url + "/v1/jobs").json()["data"] == []  # nothing stored
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


def test_the_surrogate_is_named_by_its_field(server):
    body = '{"document": "' + words(5) + '", "questions": ["fine?", "who \\ud800 is?"]}'
    resp = httpx.post(server.url + "/v1/jobs", content=body.encode(), headers={"content-type": "application/json"})
    assert resp.status_code == 400 and "field 'questions'" in resp.json()["error"]["message"], resp.text
    ok = httpx.post(server.url + "/v1/jobs", json={"document": words(5), "questions": ["fine?"]})
    assert ok.status_code in (200, 201, 202), ok.text


# -- issue 37, class 6: the service's start ---------------------------------------------------------------------
def test_a_port_in_use_is_one_line_before_the_model_loads(run_cli, tiny_model_dir, tmp_path):
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, _, err = run_cli("serve", "--model", tiny_model_dir, "--device", "cpu", "--port", port,
                               "--state-dir", tmp_path / "state")
    assert code == 2, err
    assert err.strip().splitlines() == [f"error: --port {port}: the address 127.0.0.1:{port} is already in use "
                                        "(another server?); choose another --port, or stop the program that holds it"]
    assert not (tmp_path / "state").exists()  # refused before the state folder or the model


def test_a_host_that_does_not_resolve_is_one_line(run_cli, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("KEY", "k")
    code, _, err = run_cli("serve", "--model", tiny_model_dir, "--device", "cpu", "--host", "no-such-host.invalid",
                           "--api-key-env", "KEY", "--state-dir", tmp_path / "state")
    assert code == 2, err
    [line] = err.strip().splitlines()
    assert line.startswith("error: --host 'no-such-host.invalid' does not resolve to an address")
    assert not (tmp_path / "state").exists()


def test_bound_sockets_are_released_and_then_served(tmp_path):
    """The sockets bind_sockets gives are not listening yet (a client is refused while the model loads) and
    free the port when closed."""
    import socket

    from memagent.serve.main import bind_sockets

    [sock] = bind_sockets("127.0.0.1", 0)
    port = sock.getsockname()[1]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
    sock.close()
    [again] = bind_sockets("127.0.0.1", port)
    again.close()
