"""The workflow registry (memagent.agent.registry): names, unknown names, built-ins by module path, entry points;
the default `memagent` through the registry is today's MemoryAgent to the bit; lock-step batches an open set of
call kinds; a rollout batch makes a row of every conversation, whatever its kind."""
from __future__ import annotations

import hashlib
import json

import pytest
import torch
from plugin_dist import write_dist_info

from memagent.agent import registry
from memagent.agent.registry import (AgentInput, AgentResult, Call, Conversation, UnknownWorkflow, WorkflowError,
                                     WorkflowOptions, build_workflow, get_workflow, register_workflow, run_workflow,
                                     stream_workflow, unregister_workflow, workflow_names)
from memagent.agent.scheduler import run_lockstep
from memagent.agent.workflow import MemoryAgent, memagent
from memagent.backends.base import Generation, SamplingParams
from memagent.config import AgentConfig

CFG = AgentConfig(chunk_tokens=16, memory_tokens=8, answer_tokens=8, query_tokens=64, max_batch_docs=3)
# the digest of these results computed with the code before the registry (main at 35deb87, MemoryAgent(...).run),
# 3bbb757d..., then with one change (issue 33): a memory reply that stopped at M tokens (finish reason "length") is
# recorded as cut (Conversation.truncated). With that line taken out the digest is 3bbb757d... again.
TODAY = "06e560586860bb19ac593b3dcda4da0f3ac0813b6267c8d0c9ed4ee2851aeb56"


def _inputs() -> list[AgentInput]:
    words = "river city bridge north south stone water light tower field".split()
    return [AgentInput(f"Where is the {words[i]}?", " ".join(words[(i + j) % 10] for j in range(40 + 13 * i)), str(i))
            for i in range(4)]


def _digest(results: list[AgentResult]) -> str:
    h = hashlib.sha256()
    for r in results:
        h.update(json.dumps([r.doc_id, r.answer, r.raw_answer, r.memory, r.num_chunks,
                             [[c.kind, c.step, c.prompt_ids, c.response_ids, c.text, c.truncated]
                              for c in r.conversations]]).encode())
    return h.hexdigest()


def test_greedy_memagent_through_the_registry_is_todays_result(tiny_backend):
    wf = build_workflow("memagent", tiny_backend, CFG, keep_conversations=True)
    assert wf.workflow is memagent and wf.name == "memagent"
    got = run_workflow(wf, _inputs())
    assert _digest(got) == TODAY
    assert _digest(MemoryAgent(tiny_backend, CFG, keep_conversations=True).run(_inputs())) == TODAY
    assert [r.calls for r in got] == [r.num_chunks + 1 for r in got]  # K memory updates and the answer
    streamed: list[AgentResult] = []
    stats = stream_workflow(build_workflow("memagent", tiny_backend, CFG, keep_conversations=True), iter(_inputs()),
                            streamed.append)
    assert _digest(sorted(streamed, key=lambda r: r.doc_id)) == TODAY and stats.calls == sum(r.calls for r in got)


def test_an_unknown_name_lists_the_valid_ones(run_cli, tiny_model_dir, tmp_path):
    with pytest.raises(UnknownWorkflow, match="valid workflows: memagent, .*lookup.*skim"):
        get_workflow("nope")
    doc = tmp_path / "d.txt"
    doc.write_text("some words")
    code, out, err = run_cli("ask", "--model", tiny_model_dir, "--document", doc, "--question", "q",
                             "--workflow", "nope", "--no-progress")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: unknown workflow 'nope'; valid workflows:")


def test_a_builtin_whose_module_is_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(registry.BUILTINS, "ghost", "memagent.agent.no_such_module:build")
    with pytest.raises(WorkflowError, match=r"'ghost' \(built-in, memagent.agent.no_such_module:build\) failed as "
                                            "it was imported: ModuleNotFoundError.*; install what it needs"):
        get_workflow("ghost")
    assert "ghost" in workflow_names() and workflow_names()[0] == "memagent"


def test_register_build_and_forget(tiny_backend):
    from memagent.agent.workflow import memagent

    def mine(doc, question, options):
        return (yield from memagent(doc, question, options))

    def factory(backend, config, **options):  # the earlier state-machine protocol: gone (version 0.x)
        return MemoryAgent(backend, config, **options)

    register_workflow("mine", mine)
    register_workflow("factory", factory)
    try:
        wf = build_workflow("mine", tiny_backend, CFG, failures="record")
        assert wf.name == "mine" and wf.options.failures == "record" and "mine" in workflow_names()
        with pytest.raises(WorkflowError, match="workflow 'factory' .* is not a generator function"):
            build_workflow("factory", tiny_backend, CFG)
    finally:
        unregister_workflow("mine")
        unregister_workflow("factory")
    assert "mine" not in workflow_names()
    with pytest.raises(ValueError, match="a word"):
        register_workflow("has space", factory)


def test_entry_point_of_an_installed_distribution(tmp_path, monkeypatch):
    """A package's `memagent.workflows` entry point, found through a .dist-info on sys.path."""
    (tmp_path / "ep_flow.py").write_text("from memagent.agent.workflow import MemoryAgent\n"
                                         "def build(backend, config, **options):\n"
                                         "    return MemoryAgent(backend, config, **options)\n")
    write_dist_info(tmp_path, "ep-flow", {"memagent.workflows": {"epflow": "ep_flow:build"}})
    assert "epflow" not in workflow_names()
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.refresh_entry_points()
    try:
        assert "epflow" in workflow_names()
        assert get_workflow("epflow").__module__ == "ep_flow"
    finally:
        monkeypatch.undo()
        registry.refresh_entry_points()


class _TwoKinds:
    """A scripted workflow: each document asks a "query", then a "final" call; records the batches it saw."""

    name = "two-kinds"

    def __init__(self):
        self.options, self.config = WorkflowOptions(), CFG

    def start(self, pos, item):
        return type("D", (), dict(pos=pos, item=item, calls=0, seed_key=None))()

    def next_call(self, d):
        return Call("query", "q " + d.item.question, 4) if d.calls == 0 else Call("final", "f", 8)

    def params(self, n, seed):
        return SamplingParams(n, 0.0, 1.0, seed)

    def take(self, d, call, gen, seconds, batch_size):
        if call.kind == "query":
            return None
        return AgentResult(d.item.doc_id, d.item.question, "x", "x", "", 0, calls=d.calls)

    def fail(self, d, exc):
        raise exc


class _Backend:
    def __init__(self):
        self.batches = []

    def generate(self, prompts, params):
        self.batches.append((tuple(prompts), params.max_new_tokens))
        return [Generation("x", [1], None, None) for _ in prompts]


def test_lockstep_batches_a_kind_of_a_workflows_own():
    b = _Backend()
    items = [AgentInput(str(i), "", str(i)) for i in range(3)]
    results, stats = run_lockstep(_TwoKinds(), b, items, max_docs=3, seed=0)
    assert b.batches == [(("q 0", "q 1", "q 2"), 4), (("f", "f", "f"), 8)]  # one batch per kind, its own budget
    assert stats.calls == 6 and [r.calls for r in results] == [2, 2, 2]


def test_every_conversation_of_any_kind_is_a_row_with_the_samples_advantage(monkeypatch):
    """generate_rollouts over a registered workflow whose samples have a "query" conversation: 2 questions x G=2,
    rewards (1, 0 | 1, 1): advantages R - group mean = (0.5, -0.5 | 0, 0), broadcast to each sample's 2 rows."""
    from memagent.rl.rollout import generate_rollouts
    from memagent.rl.samples import QASample

    def conv(kind, ids):
        return Conversation(kind, 0, "p", [7], ids, None, "t")

    def scripted(doc, question, options):  # its results are fake_run's
        yield Call("final", "f", 4)

    def fake_run(wf, items):
        raws = ["\\boxed{a}", "\\boxed{b}", "\\boxed{a}", "\\boxed{a}"]
        return [AgentResult(it.doc_id, it.question, None, raw, "", 1, [conv("query", [s]), conv("final", [9, s])])
                for s, (it, raw) in enumerate(zip(items, raws))]

    register_workflow("scripted", scripted)
    monkeypatch.setattr("memagent.rl.rollout.run_workflow", fake_run)
    try:
        qs = [QASample("1", "q", "c", ["a"]), QASample("2", "q", "c", ["a"])]
        batch = generate_rollouts(None, CFG, qs, [0, 1], 2, lambda raw, golds: float(raw == "\\boxed{a}"),
                                  seed=0, workflow="scripted").with_advantages()
    finally:
        unregister_workflow("scripted")
    assert batch.response_ids == [[0], [9, 0], [1], [9, 1], [2], [9, 2], [3], [9, 3]]
    assert batch.sample_index.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert batch.is_final.tolist() == [False, True] * 4
    assert torch.equal(batch.advantages, torch.tensor([0.5, 0.5, -0.5, -0.5, 0.0, 0.0, 0.0, 0.0]))


def test_validation_reads_with_the_training_workflow(tiny_backend, monkeypatch):
    from memagent.rl import validation
    from memagent.rl.distributed import DistInfo
    from memagent.rl.samples import QASample
    from memagent.rl.validation import Validator

    built = []

    def counted(doc, question, options):
        return (yield from memagent(doc, question, options))

    def build(name, backend, config, **options):
        built.append((name, config.temperature, options))
        return build_workflow(name, backend, config, **options)

    monkeypatch.setattr(validation, "build_workflow", build)
    register_workflow("counted", counted)
    try:
        v = Validator([QASample("1", "Which river?", "the river Nile " * 8, ("Nile",))], every=1,
                      agent=AgentConfig(chunk_tokens=16, memory_tokens=8, answer_tokens=8, temperature=0.7),
                      reward_fn=lambda raw, golds: 0.0, seed=0, info=DistInfo(), workflow="counted",
                      workflow_options={"trace_chunks": True})
        got = v.metrics(1, tiny_backend)
    finally:
        unregister_workflow("counted")
    assert got == {"val/greedy_acc": 0.0, "val/sampled_acc": 0.0}
    # greedy, then sampled
    assert built == [("counted", 0.0, {"trace_chunks": True}), ("counted", 0.7, {"trace_chunks": True})]


def test_serve_checks_the_window_of_the_workflow_it_runs(tiny_tokenizer):
    """serve's start-up check builds the server's workflow: its declared largest prompt, not the paper's."""
    from fakes import ScriptedBackend

    from memagent.agent.protocol import BudgetError, Prompt, workflow
    from memagent.serve.main import check_ready

    cfg = AgentConfig(chunk_tokens=16, memory_tokens=8, answer_tokens=8, query_tokens=16)

    @workflow(window=lambda c, o: [Prompt("{question}", dict(query=c.query_tokens, output=200), "the wide call")])
    def wide(doc, question, options):
        reply = yield Call("final", question, 200)
        return reply

    backend = ScriptedBackend(tiny_tokenizer, lambda p, c: "x", max_window=200)
    register_workflow("wide", wide)
    try:
        check_ready(backend, cfg)  # memagent's calls fit: 139 tokens (the paper's memory template 91 + 16 + 16 + 2 * 8)
        with pytest.raises(BudgetError, match=r"the wide call needs up to 216 tokens \(template 0 \+ query 16 \+ "
                                              r"output 200\) but the model's window is 200"):
            check_ready(backend, cfg, "wide")
    finally:
        unregister_workflow("wide")


def test_a_generator_workflow_with_options_of_its_own_and_a_kind_of_its_own(tiny_tokenizer):
    """The runner does the recording: a call the workflow did not keep() is traced with its text and generated
    tokens; keep() sets the conversation's text and the record's fields; options come checked by their class."""
    from dataclasses import dataclass

    from memagent.agent.protocol import Answer, workflow

    @dataclass
    class Opts:
        times: int = 1

        def __post_init__(self):
            if self.times < 1:
                raise ValueError("times must be at least 1")

    @workflow(options=Opts)
    def twice(doc, question, o):
        for i in range(o.times):
            yield Call("note", f"n{i} {question}", 4, step=i)  # not kept: the record carries the reply's text
        reply = yield Call("final", "f", 8, step=o.times)
        reply.keep("kept " + reply.text, answer="a", raw_answer=reply.text)
        return Answer("a", reply.text, "", o.times)

    from fakes import ScriptedBackend

    records, backend = [], ScriptedBackend(tiny_tokenizer, lambda p, c: "x")
    n = lambda text: len(tiny_tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    register_workflow("twice", twice)
    try:
        wf = build_workflow("twice", backend, CFG, times=2, keep_conversations=True, on_step=records.append)
        [res] = run_workflow(wf, [AgentInput("q", "", "d")])
        with pytest.raises(ValueError, match="at least 1"):
            build_workflow("twice", backend, CFG, times=0)
    finally:
        unregister_workflow("twice")
    assert (res.answer, res.num_chunks, res.calls) == ("a", 2, 3)
    assert [(c.kind, c.step, c.text) for c in res.conversations] == [("note", 0, "x"), ("note", 1, "x"),
                                                                     ("final", 2, "kept x")]
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in records] == [
        dict(doc_id="d", step=0, kind="note", prompt_tokens=n("n0 q"), text="x", generated_tokens=n("x"), batch_size=1),
        dict(doc_id="d", step=1, kind="note", prompt_tokens=n("n1 q"), text="x", generated_tokens=n("x"), batch_size=1),
        dict(doc_id="d", step=2, kind="final", prompt_tokens=n("f"), answer="a", raw_answer="x", batch_size=1)]
    assert backend.batches == [["n0 q"], ["n1 q"], ["f"]]  # one document: a batch per call


def test_a_workflow_must_yield_calls_and_return_an_answer(tiny_tokenizer):
    from fakes import ScriptedBackend

    from memagent.agent.protocol import WorkflowError, workflow

    @workflow()
    def bad(doc, question, options):
        yield "not a call"

    @workflow()
    def plain(doc, question, options):
        reply = yield Call("final", "f", 4)
        return reply.text  # not an Answer

    backend = ScriptedBackend(tiny_tokenizer, lambda p, c: "x")
    register_workflow("bad", bad)
    register_workflow("plain", plain)
    try:
        with pytest.raises(WorkflowError, match="workflow bad must yield a Call, got str"):
            run_workflow(build_workflow("bad", backend, CFG), [AgentInput("q", "", "d")])
        with pytest.raises(WorkflowError, match="workflow plain must return an Answer, got str"):
            run_workflow(build_workflow("plain", backend, CFG), [AgentInput("q", "", "d")])
    finally:
        unregister_workflow("bad")
        unregister_workflow("plain")
