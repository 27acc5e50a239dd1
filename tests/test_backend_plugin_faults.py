"""A third-party backend's faults are its own (issue 48, class 1): whatever its factory, `generate` or
`prompt_length` raises (or a `sys.exit` they call), whatever wrong thing they return (None, a string, fewer replies
than prompts, a 10 MB reply, a lone surrogate, a window of NaN, a negative length), and a package that exits as it
is imported, is one `BackendError` line naming the plug-in (exit 2, never "internal error", never a silent exit
0): at the start of `ask`, `eval` and `serve`, or failing only the documents of that call (`ask --input`)."""
from __future__ import annotations

import json
import sys

import pytest
from plugin_dist import write_dist_info

from memagent import backends
from memagent.backends import register_backend, unregister_backend
from memagent.backends.base import Generation

ASK = ["--question", "What is fact7?", "--chunk-tokens", 40, "--memory-tokens", 8, "--answer-tokens", 8,
       "--no-progress"]
MODULE = "module test_backend_plugin_faults"


class Plugin:
    """A backend over the tiny tokenizer that replies "fact", broken as `mode` says."""

    def __init__(self, tokenizer, mode: str):
        self.tokenizer, self.mode, self.max_window = tokenizer, mode, 4096
        if mode == "tokenizer_none":
            self.tokenizer = None
        if mode == "window_str":
            self.max_window = "big"
        if mode == "window_nan":
            self.max_window = float("nan")

    def prompt_length(self, prompt):
        if self.mode == "length_raises":
            raise KeyError("no template")
        if self.mode == "length_negative":
            return -5
        return len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def generate(self, prompts, params):
        m = self.mode
        if m == "raises" or (m == "raises_on_boom" and any("boom" in p for p in prompts)):
            raise RuntimeError("model fell over")
        if m == "exit0":
            sys.exit(0)
        if m == "none":
            return None
        if m == "strings":
            return ["fact" for _ in prompts]
        if m == "fewer":
            return []
        texts = {"int_text": 7, "surrogate": "fa\ud800ct", "huge": "x" * 10_000_000}.get(m, "fact")
        return [Generation(text=texts, token_ids=[1]) for _ in prompts]


FAULTS = [
    ("factory_raises", "failed as it was built: RuntimeError: no weights here"),
    ("factory_none", "cannot be used: its factory returned NoneType, not a backend"),
    ("factory_str", "cannot be used: its factory returned str, not a backend"),
    ("tokenizer_none", "cannot be used: its tokenizer is NoneType, not a tokenizer"),
    ("window_str", "cannot be used: its max_window is 'big', not a positive integer or None"),
    ("window_nan", "cannot be used: its max_window is nan, not a positive integer or None"),
    ("length_raises", "failed counting a prompt's tokens: KeyError: 'no template'"),
    ("length_negative", "cannot be used: prompt_length returned -5, not an integer >= 0"),
    ("raises", "failed generating: RuntimeError: model fell over"),
    ("exit0", "failed generating: SystemExit: 0"),
    ("none", "cannot be used: generate returned NoneType, not a list of Generation"),
    ("strings", "cannot be used: generate returned a str among its results, not a Generation"),
    ("fewer", "cannot be used: generate returned 0 results for 1 prompts"),
    ("int_text", "cannot be used: generate returned a Generation whose text is int, not text"),
    ("surrogate", "cannot be used: generate returned text that is not valid UTF-8 (a lone surrogate at character 2)"),
    ("huge", "cannot be used: generate returned a reply of 10,000,000 characters for max_new_tokens 8, over the "
             "bound of 2,048"),
]


@pytest.fixture
def plugin(tiny_tokenizer):
    """register(mode) registers the backend `bad` broken as `mode`; unregistered after the test."""
    def register(mode: str) -> None:
        def factory(model, **kwargs):
            if mode == "factory_raises":
                raise RuntimeError("no weights here")
            if mode == "factory_none":
                return None
            if mode == "factory_str":
                return "a backend"
            return Plugin(tiny_tokenizer, mode)

        register_backend("bad", factory)

    yield register
    unregister_backend("bad")


def _doc(tmp_path, text=" ".join(f"fact{i} is value{i}." for i in range(30))):
    doc = tmp_path / "doc.txt"
    doc.write_text(text)
    return doc


@pytest.mark.parametrize("mode, message", FAULTS, ids=[m for m, _ in FAULTS])
def test_ask_names_the_plugin_in_one_line(mode, message, plugin, run_cli, tmp_path):
    plugin(mode)
    trace = tmp_path / "trace.jsonl"
    code, out, err = run_cli("ask", "--backend", "bad", "--model", "m", "--document", _doc(tmp_path),
                             "--trace", trace, *ASK)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err and "internal error" not in err, err
    assert lines[0].startswith(f"error: backend 'bad' (a plug-in, {MODULE}) ") and message in lines[0], err
    assert out == ""


def test_ask_input_fails_only_the_documents_the_plugin_failed_on(plugin, run_cli, tmp_path):
    plugin("raises_on_boom")
    inp, out = tmp_path / "in.jsonl", tmp_path / "answers.jsonl"
    inp.write_text(json.dumps(dict(id="ok", question="q?", context="the river is long")) + "\n"
                   + json.dumps(dict(id="bad", question="boom?", context="the river is long")) + "\n")
    code, _, err = run_cli("ask", "--backend", "bad", "--model", "m", "--input", inp, "--output", out, *ASK[2:])
    assert "Traceback" not in err and "internal error" not in err, err
    assert code == 2 and err.strip().splitlines()[-1].startswith("error: 1 of 2"), err
    records = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert records["ok"].get("error") is None and records["ok"]["raw_answer"] == "fact"
    assert records["bad"]["error"]["kind"] == "BackendError"
    assert "backend 'bad' (a plug-in, module test_backend_plugin_faults) failed generating: RuntimeError: model " \
           "fell over" in records["bad"]["error"]["message"]


def test_eval_and_serve_name_the_plugin_at_start(plugin, run_cli, tmp_path):
    pytest.importorskip("fastapi")
    plugin("window_nan")
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps(dict(id="s0", task="qa", question="Where?", answers=["x"], metric="sub_em",
                                    context="words " * 20, length=10)) + "\n")
    for args in (("eval", "--data", data, "--out", tmp_path / "run", "--methods", "memagent"),
                 ("serve", "--state-dir", tmp_path / "state", "--port", "1")):
        code, _, err = run_cli(*args, "--backend", "bad", "--model", "m")
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and "Traceback" not in err, (args[0], err)
        assert lines[0].startswith(f"error: backend 'bad' (a plug-in, {MODULE}) cannot be used: its max_window is "
                                   "nan"), (args[0], err)


def test_a_package_that_exits_as_it_is_imported_is_one_line(run_cli, tmp_path, monkeypatch):
    site = tmp_path / "site"
    write_dist_info(site, "exits", {"memagent.backends": {"exits": "backend_exits:Backend"}})
    (site / "backend_exits.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(site))
    backends._REGISTRY.refresh()
    try:
        code, _, err = run_cli("ask", "--backend", "exits", "--model", "m", "--document", _doc(tmp_path), *ASK)
    finally:
        monkeypatch.undo()
        backends._REGISTRY.refresh()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("error: backend 'exits' (entry point memagent.backends, backend_exits:Backend) failed as it "
                               "was imported: SystemExit: 3; "
                               "this is a fault of the plug-in"), err


def test_a_sound_plugin_is_used_unchanged(tiny_tokenizer):
    """The guard passes a sound plug-in's replies through as they are, and its own attributes."""
    from memagent.backends.base import SamplingParams

    register_backend("good", lambda model, **kw: Plugin(tiny_tokenizer, "fine"))
    try:
        b = backends.load_backend("good", "m")
    finally:
        unregister_backend("good")
    assert type(b.inner) is Plugin and b.mode == "fine" and b.max_window == 4096 and b.tokenizer is tiny_tokenizer
    [g] = b.generate(["p"], SamplingParams(4))
    assert g.text == "fact" and g.token_ids == [1]
    assert b.prompt_length("a b c") == Plugin(tiny_tokenizer, "fine").prompt_length("a b c")
    assert not hasattr(b, "submit")
