"""A third-party workflow's faults are its own: whatever it raises (at import, as it is built, declaring its window,
in its body), a bad call it yields or a bad answer it returns is a WorkflowError naming the plug-in that fails that
document only (recorded like any failed document), never "memagent hit an internal error"; its calls are bounded
(each prompt counted against the window before it is sent, a per-document call cap), and `serve` keeps answering
while such a job runs (issue 37, "Nothing lost, round 4", class 2)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fakes import ScriptedBackend
from plugin_dist import write_dist_info

from memagent.agent import registry
from memagent.agent.protocol import Answer, BudgetError, Call, Prompt, WorkflowError, paper_window, workflow
from memagent.agent.registry import (AgentInput, build_workflow, register_workflow, run_workflow,
                                     unregister_workflow)
from memagent.agent.workflow import answer, read
from memagent.config import AgentConfig

CFG = AgentConfig(chunk_tokens=16, memory_tokens=8, answer_tokens=8, query_tokens=16)


@workflow()
def raises_at_start(doc, question, options):
    raise RuntimeError("no luck")
    yield  # noqa: unreachable - a generator function


@workflow()
def raises_after_a_call(doc, question, options):
    memory = yield from read(doc, question, doc.chunks(), doc.memory)
    if "boom" in question:
        raise KeyError("boom")
    return (yield from answer(doc, question, memory, doc.num_chunks))


@workflow()
def number_answer(doc, question, options):
    reply = yield Call("final", "f", 4)
    return Answer(42, reply.text, "", 0)  # the answer must be text or None


@workflow()
def zero_tokens(doc, question, options):
    yield Call("final", "f", 0)


@workflow()
def prompt_none(doc, question, options):
    yield Call("final", None, 4)


def _bad_window(config, options):
    raise ValueError("cannot count")


@workflow(window=_bad_window)
def bad_window(doc, question, options):
    yield Call("final", "f", 4)


@workflow()
def huge_prompt(doc, question, options):
    yield Call("echo", "word " * 2_000_000, 4)  # 10 MB, ~2M tokens, far over a 256-token window
    return Answer("never", "", "", 0)


@workflow()
def never_finishes(doc, question, options):
    while True:
        yield Call("echo", "again", 2)


def old_factory(backend, config, **options):  # the earlier protocol: a factory that raises as it is built
    raise AttributeError("'NoneType' object has no attribute 'x'")


PLUGINS = dict(raises_at_start=raises_at_start, raises_after_a_call=raises_after_a_call, number_answer=number_answer,
               zero_tokens=zero_tokens, prompt_none=prompt_none, bad_window=bad_window, huge_prompt=huge_prompt,
               never_finishes=never_finishes, old_factory=old_factory)


@pytest.fixture
def plugins():
    for name, fn in PLUGINS.items():
        register_workflow(name, fn)
    yield
    for name in PLUGINS:
        unregister_workflow(name)


def _backend(tok, window=None):
    return ScriptedBackend(tok, lambda p, c: "fact", max_window=window)


ITEMS = [AgentInput("which?", "a short document of a few words", "ok"),
         AgentInput("boom?", "a short document of a few words", "bad")]


@pytest.mark.parametrize("name, message", [
    ("raises_at_start", "workflow raises_at_start (a plug-in, module test_workflow_plugin_faults) failed reading "
                        "document d: RuntimeError: no luck; this is a fault of the plug-in"),
    ("number_answer", "workflow number_answer returned an Answer with answer of type int (document d)"),
    ("zero_tokens", "workflow zero_tokens yielded a Call with max_new_tokens 0 (document d)"),
    ("prompt_none", "workflow prompt_none yielded a Call with prompt of type NoneType (document d)"),
])
def test_a_plugins_fault_fails_its_document_named_as_its_own(plugins, tiny_tokenizer, name, message):
    wf = build_workflow(name, _backend(tiny_tokenizer), CFG, failures="record")
    [r] = run_workflow(wf, [AgentInput("q", "words", "d")])
    assert r.answer is None and r.error["kind"] in ("WorkflowError", "BudgetError"), r.error
    assert message in r.error["message"], r.error["message"]
    with pytest.raises(WorkflowError, match="workflow " + name):  # failures="raise": the run stops with it
        run_workflow(build_workflow(name, _backend(tiny_tokenizer), CFG), [AgentInput("q", "words", "d")])


def test_only_the_document_it_raised_on_fails(plugins, tiny_tokenizer):
    wf = build_workflow("raises_after_a_call", _backend(tiny_tokenizer), CFG, failures="record")
    ok, bad = run_workflow(wf, ITEMS)
    assert ok.error is None and ok.raw_answer == "fact" and ok.calls == ok.num_chunks + 1
    assert bad.error["kind"] == "WorkflowError" and "KeyError: 'boom'" in bad.error["message"]
    assert bad.calls == bad.num_chunks >= 1 and bad.memory == "fact"  # it read its chunks, then raised


def test_a_broken_window_declaration_or_factory_is_named_before_any_call(plugins, tiny_tokenizer):
    backend = _backend(tiny_tokenizer, window=512)
    with pytest.raises(WorkflowError, match="workflow bad_window .* failed declaring its window: ValueError: "
                                            "cannot count"):
        run_workflow(build_workflow("bad_window", backend, CFG), [AgentInput("q", "words", "d")])
    with pytest.raises(WorkflowError, match="workflow 'old_factory' .* is not a generator function"):
        build_workflow("old_factory", backend, CFG)  # the earlier protocol is gone: named, never built
    assert backend.batches == []


def test_a_prompt_far_over_the_window_is_refused_before_it_is_sent_and_fast(plugins, tiny_tokenizer):
    backend = _backend(tiny_tokenizer, window=256)
    t0 = time.perf_counter()
    [r] = run_workflow(build_workflow("huge_prompt", backend, CFG, failures="record"), [AgentInput("q", "w", "d")])
    assert time.perf_counter() - t0 < 5.0  # counted in pieces, stopped once over: not the whole 10 MB
    assert r.error["kind"] == "BudgetError" and "over the model's window of 256; nothing was sent" in \
        r.error["message"]
    assert backend.batches == []


def test_a_workflow_that_never_finishes_stops_at_the_call_cap(plugins, tiny_tokenizer):
    backend = _backend(tiny_tokenizer)
    [r] = run_workflow(build_workflow("never_finishes", backend, CFG, failures="record", max_calls=5),
                       [AgentInput("q", "w", "d")])
    assert r.calls == 5 and len(backend.batches) == 5 and "over its cap of 5 calls (max_calls)" in r.error["message"]
    backend = _backend(tiny_tokenizer)  # the default: 8 per chunk read (none here) + 64
    [r] = run_workflow(build_workflow("never_finishes", backend, CFG, failures="record"), [AgentInput("q", "w", "d")])
    assert r.calls == 64 and "over its cap of 64 calls (8 per chunk read (0) + 64)" in r.error["message"]


def test_memagent_and_lookup_stay_well_under_the_default_cap(tiny_tokenizer):
    doc = "the river runs past the old city and under the stone bridge " * 8
    for name, options in (("memagent", {}), ("lookup", dict(lookups=4, hits=8))):
        [r] = run_workflow(build_workflow(name, _backend(tiny_tokenizer), CFG, **options), [AgentInput("q", doc)])
        assert r.error is None and r.calls <= 8 * r.num_chunks + 64


def test_ask_input_records_the_plugins_failure_and_answers_the_rest(plugins, run_cli, tiny_model_dir, tmp_path):
    questions, out = tmp_path / "q.jsonl", tmp_path / "answers.jsonl"
    questions.write_text("".join(json.dumps(dict(id=it.doc_id, question=it.question, context=it.document)) + "\n"
                                 for it in ITEMS))
    code, _, err = run_cli("ask", "--model", tiny_model_dir, "--input", questions, "--output", out,
                           "--workflow", "raises_after_a_call", "--no-progress", "--chunk-tokens", "16",
                           "--memory-tokens", "8", "--answer-tokens", "8")
    assert "internal error" not in err and "Traceback" not in err
    assert code == 2 and err.strip().splitlines()[-1].startswith("error: 1 of 2"), err
    records = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(records) == {"ok", "bad"} and records["ok"].get("error") is None
    assert "workflow raises_after_a_call (a plug-in" in records["bad"]["error"]["message"]


PLUGIN_MODULES = {
    "raises": "raise RuntimeError('broken at import')\n",
    "exits": "import sys\nsys.exit(3)\n",
}


@pytest.fixture
def broken_installed(tmp_path, monkeypatch):
    """Two installed plug-ins whose modules fail as they are imported (a RuntimeError, a sys.exit)."""
    site = tmp_path / "site"
    write_dist_info(site, "broken", {"memagent.workflows": {name: f"broken_{name}:wf" for name in PLUGIN_MODULES}})
    for name, code in PLUGIN_MODULES.items():
        (site / f"broken_{name}.py").write_text(code)
    monkeypatch.syspath_prepend(str(site))
    registry.refresh_entry_points()
    yield
    monkeypatch.undo()
    registry.refresh_entry_points()


@pytest.mark.parametrize("name, detail", [("raises", "RuntimeError: broken at import"), ("exits", "SystemExit: 3")])
def test_a_plugin_that_breaks_at_import_is_one_error_line(broken_installed, run_cli, tmp_path, name, detail):
    doc = tmp_path / "doc.txt"
    doc.write_text("words")
    for args in (("ask", "--document", doc, "--question", "q"), ("serve", "--state-dir", tmp_path / "state")):
        code, _, err = run_cli(*args, "--model", tmp_path / "no-model", "--workflow", name)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1, err
        assert lines[0].startswith(f"error: workflow '{name}' (entry point memagent.workflows, broken_{name}:wf) "
                                   f"failed as it was imported: {detail}; this is a fault of the plug-in"), err


def test_serve_fails_the_plugins_job_by_name_and_keeps_answering(plugins, tiny_backend, tmp_path, monkeypatch):
    pytest.importorskip("fastapi")
    import httpx

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "serve"))
    from serve_helpers import ThreadServer

    with ThreadServer(tiny_backend, tmp_path / "state") as s:
        jobs = {}
        for name in ("huge_prompt", "raises_at_start"):
            jobs[name] = httpx.post(s.url + "/v1/jobs", json={"document": "the river " * 20, "questions": ["q?"],
                                                              "workflow": name}).json()["id"]
        t0, slowest = time.perf_counter(), 0.0
        while time.perf_counter() - t0 < 60:
            t = time.perf_counter()
            assert httpx.get(s.url + "/health", timeout=10).status_code == 200
            slowest = max(slowest, time.perf_counter() - t)
            views = {n: httpx.get(f"{s.url}/v1/jobs/{j}").json() for n, j in jobs.items()}
            if all(v["state"] in ("done", "failed") for v in views.values()):
                break
            time.sleep(0.05)
    assert slowest < 2.0
    assert views["raises_at_start"]["state"] == "failed" and "internal error" not in views["raises_at_start"]["error"]
    assert "workflow raises_at_start (a plug-in" in views["raises_at_start"]["error"]
    assert views["huge_prompt"]["state"] == "failed" and "over the model's window" in views["huge_prompt"]["error"]


@workflow()
def keeps_a_number(doc, question, options):
    reply = yield Call("echo", "note", 4)
    reply.keep(7)  # the conversation's text must be a string
    return Answer("a", reply.text, "", 0)


@workflow()
def keeps_an_object(doc, question, options):
    reply = yield Call("echo", "note", 4)
    reply.keep(reply.text, note=object())  # not JSON: the trace line could not be written
    return Answer("a", reply.text, "", 0)


def test_a_bad_record_fails_one_document(tiny_tokenizer, tmp_path):
    register_workflow("keeps_an_object", keeps_an_object)
    try:
        wf = build_workflow("keeps_an_object", _backend(tiny_tokenizer), CFG, failures="record",
                            trace_path=tmp_path / "t.jsonl")
        [r] = run_workflow(wf, [AgentInput("q", "w", "d")])
        assert "workflow keeps_an_object kept a trace record that is not plain JSON" in r.error["message"]
        register_workflow("keeps_a_number", keeps_a_number)
        [r] = run_workflow(build_workflow("keeps_a_number", _backend(tiny_tokenizer), CFG, failures="record"),
                           [AgentInput("q", "w", "d")])
        assert "workflow keeps_a_number kept a reply's text of type int (document d)" in r.error["message"]
    finally:
        unregister_workflow("keeps_an_object")
        unregister_workflow("keeps_a_number")


def test_options_that_are_not_a_dataclass_are_the_plugins_fault(tiny_tokenizer):
    @workflow(options=dict)
    def dict_options(doc, question, options):
        yield Call("final", "f", 4)

    register_workflow("dict_options", dict_options)
    try:
        with pytest.raises(WorkflowError, match="workflow dict_options declares options=<class 'dict'>, which is "
                                                "not a dataclass"):
            registry.check_workflow_options("dict_options", {"x": 1})
    finally:
        unregister_workflow("dict_options")


def test_serve_refuses_to_start_on_a_plugin_whose_window_declaration_raises(plugins, run_cli, tiny_model_dir,
                                                                            tmp_path):
    pytest.importorskip("fastapi")
    code, _, err = run_cli("serve", "--model", tiny_model_dir, "--workflow", "bad_window", "--state-dir",
                           tmp_path / "state", "--port", "1")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: workflow bad_window (a plug-in, module test_workflow_plugin_faults) failed "
                               "declaring its window: ValueError: cannot count"), err
