"""A plug-in written to the earlier step protocol (a factory returning a state machine: start, next_call, take,
fail, ...) gets the checks a generator workflow gets (issue 48, class 8): each call it chooses is a sound Call,
within the per-document call cap and counted against the window before it is sent; each result a sound
AgentResult. A bad one fails that document only (named as the plug-in's), never a traceback or a run that never
ends."""
from __future__ import annotations

import json
import time

import pytest
from fakes import ScriptedBackend

from memagent.agent.protocol import AgentResult, Call
from memagent.agent.registry import AgentInput, build_workflow, register_workflow, run_workflow, unregister_workflow
from memagent.agent.workflow import MemoryAgent
from memagent.config import AgentConfig

CFG = AgentConfig(chunk_tokens=16, memory_tokens=8, answer_tokens=8, query_tokens=16)


def machine(mode: str):
    """A factory of the earlier protocol: the paper's workflow, its next call or its result replaced as `mode`
    says on the document "bad" (every other document runs as the paper's)."""
    def factory(backend, config, **options):
        agent = MemoryAgent(backend, config, **options)

        class Machine:
            def __getattr__(self, attr):
                return getattr(agent, attr)

            def next_call(self, d):
                if d.item.doc_id != "bad":
                    return agent.next_call(d)
                if mode == "tuple":
                    return ("memory", "a prompt", 4)
                if mode == "huge":
                    return Call("echo", "word " * 300_000, 4)
                if mode == "forever":
                    return Call("echo", "again", 2)
                return agent.next_call(d)

            def take(self, d, call, gen, seconds, batch):
                if d.item.doc_id != "bad":
                    return agent.take(d, call, gen, seconds, batch)
                if mode == "forever":
                    return None
                if mode == "str_result":
                    return "done"
                if mode == "int_answer":
                    return AgentResult("bad", "q", 42, "r", "", 0)
                if mode == "none_raw":
                    return AgentResult("bad", "q", None, None, "", 0)
                return agent.take(d, call, gen, seconds, batch)

        return Machine()

    return factory


MODES = [
    ("tuple", "workflow steps must return from next_call a Call, got tuple (document bad)"),
    ("huge", "workflow steps asked for a call of kind 'echo' (document bad) with over "),
    ("forever", "workflow steps asked for call 65 of document bad, over its cap of 64 calls (8 per chunk read (0) + "
                "64)"),
    ("str_result", "workflow steps must return an AgentResult (or None) from take, got str (document bad)"),
    ("int_answer", "workflow steps returned an AgentResult with answer of type int (document bad)"),
    ("none_raw", "workflow steps returned an AgentResult with raw_answer of type NoneType (document bad)"),
]

ITEMS = [AgentInput("which?", "a short document of a few words", "ok"),
         AgentInput("which?", "a short document of a few words", "bad")]


@pytest.fixture
def steps():
    def register(mode: str) -> None:
        register_workflow("steps", machine(mode))

    yield register
    unregister_workflow("steps")


@pytest.mark.parametrize("mode, message", MODES, ids=[m for m, _ in MODES])
def test_a_bad_call_or_result_fails_that_document_only(mode, message, steps, tiny_tokenizer):
    steps(mode)
    backend = ScriptedBackend(tiny_tokenizer, lambda p, c: "fact", max_window=256)
    t0 = time.perf_counter()
    ok, bad = run_workflow(build_workflow("steps", backend, CFG, failures="record"), ITEMS)
    assert time.perf_counter() - t0 < 10
    assert ok.error is None and ok.raw_answer == "fact"
    assert bad.error is not None and bad.error["kind"] in ("WorkflowError", "BudgetError")
    assert bad.error["message"].startswith(message), bad.error["message"]


@pytest.mark.parametrize("mode, message", [MODES[0], MODES[2], MODES[4]], ids=["tuple", "forever", "int_answer"])
def test_ask_names_it_in_one_line_and_ask_input_answers_the_rest(mode, message, steps, run_cli, tiny_model_dir,
                                                                tmp_path):
    steps(mode)
    small = ["--no-progress", "--chunk-tokens", "16", "--memory-tokens", "8", "--answer-tokens", "8"]
    questions, out = tmp_path / "q.jsonl", tmp_path / "answers.jsonl"
    questions.write_text("".join(json.dumps(dict(id=it.doc_id, question=it.question, context=it.document)) + "\n"
                                 for it in ITEMS))
    code, _, err = run_cli("ask", "--model", tiny_model_dir, "--input", questions, "--output", out,
                           "--workflow", "steps", *small)
    assert "internal error" not in err and "Traceback" not in err, err
    assert code == 2 and err.strip().splitlines()[-1].startswith("error: 1 of 2"), err
    records = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert records["ok"].get("error") is None and records["bad"]["error"]["message"].startswith(message)
