"""Issue 37, class 5: `memagent serve` reads request JSON with the CLI's bounds (`memagent.bounded`): a body
nested too deep, an integer of 5,000 digits and a lone surrogate in a question or the document were HTTP 500;
now each is a 400 naming what is wrong, nothing is stored, and the server goes on."""
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
