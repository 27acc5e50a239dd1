"""Reasoning models: chat_template_kwargs reach the chat template and the server; think blocks are cut
before the memory cap and the answer, and the trace says so; YaRN rope scaling reaches the backends."""
from __future__ import annotations

import copy
import json
import sys
import types

import pytest

from memagent.agent.workflow import AgentInput, MemoryAgent
from memagent.backends.base import SamplingParams
from memagent.backends.hf import TransformersBackend, yarn_rope
from memagent.backends.openai import OpenAIBackend
from memagent.config import AgentConfig

from fakes import ScriptedBackend

TEMPLATE = ("{% for m in messages %}<u>{{ m['content'] }}</u>{% endfor %}"
            "{% if enable_thinking is defined and not enable_thinking %}<nothink>{% endif %}<a>")


@pytest.fixture
def thinking_tokenizer(tiny_backend):
    tok = copy.deepcopy(tiny_backend.tokenizer)
    tok.chat_template = TEMPLATE
    return tok


def test_chat_template_kwargs_reach_the_transformers_chat_template(tiny_backend, thinking_tokenizer):
    plain = TransformersBackend(tiny_backend.model, thinking_tokenizer)
    off = TransformersBackend(tiny_backend.model, thinking_tokenizer, chat_template_kwargs={"enable_thinking": False})
    on = TransformersBackend(tiny_backend.model, thinking_tokenizer, chat_template_kwargs={"enable_thinking": True})
    assert plain.render("hi") == on.render("hi") == "<u>hi</u><a>"
    assert off.render("hi") == "<u>hi</u><nothink><a>"
    assert thinking_tokenizer.decode(off.encode("hi")) == "<u>hi</u><nothink><a>"
    assert off.prompt_length("hi") > plain.prompt_length("hi")
    gen = off.generate(["hi"], SamplingParams(2))[0]
    assert gen.prompt_token_ids == off.encode("hi")  # what the model read had the kwarg rendered


def test_chat_template_kwargs_reach_the_server_request_body(openai_server, tiny_model_dir, thinking_tokenizer):
    b = OpenAIBackend(model="tiny", base_url=openai_server.url, tokenizer=thinking_tokenizer, timeout=5.0,
                      chat_template_kwargs={"enable_thinking": False}, extra_body={"top_k": 5})
    b.generate(["hello"], SamplingParams(3))
    [body] = openai_server.bodies
    assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["top_k"] == 5
    assert thinking_tokenizer.decode(b.encode("hello")) == "<u>hello</u><nothink><a>"  # local lengths render it too


def test_the_think_block_is_cut_before_the_memory_cap_and_the_answer(tiny_tokenizer, tmp_path):
    musing = "<think>" + "hmm " * 60 + "</think>"

    def reply(prompt, call):
        if "|C:" in prompt:
            return musing + " memo"
        return "<think>maybe \\boxed{wrong}</think>\\boxed{right}"

    cfg = dict(chunk_tokens=40, memory_tokens=16, answer_tokens=8, query_tokens=16, empty_memory="EMPTY",
               memory_template="Q:{question}|M:{memory}|C:{chunk}|", final_template="Q:{question}|M:{memory}|A:")
    trace = tmp_path / "t.jsonl"
    [res] = MemoryAgent(ScriptedBackend(tiny_tokenizer, reply), AgentConfig(**cfg), trace_path=trace).run(
        [AgentInput("q", "word " * 30, "d")])
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert records[0]["memory"] == "memo" and records[0]["think_removed"] and not records[0]["truncated"]
    assert records[-1]["think_removed"] and records[-1]["answer"] == "right"
    assert (res.answer, res.memory, res.think_removed) == ("right", "memo", True)
    assert res.raw_answer.startswith("<think>")  # the raw reply is kept whole

    kept = MemoryAgent(ScriptedBackend(tiny_tokenizer, reply), AgentConfig(**cfg, think="keep"),
                       trace_path=tmp_path / "k.jsonl").run([AgentInput("q", "word " * 30, "d")])[0]
    k = [json.loads(line) for line in (tmp_path / "k.jsonl").read_text().splitlines()]
    assert k[0]["truncated"] and not k[0]["think_removed"] and kept.memory.startswith("<think>hmm")
    assert kept.answer == "right"  # the last box is outside the think block here too


def test_the_phrase_protocol_in_the_workflow(tiny_tokenizer):
    cfg = AgentConfig(chunk_tokens=40, memory_tokens=16, answer_tokens=8, query_tokens=16, answer_protocol="phrase")
    backend = ScriptedBackend(tiny_tokenizer, lambda p, c: "So the answer is Paris." if "Your answer" in p else "m")
    [res] = MemoryAgent(backend, cfg).run([AgentInput("q", "word " * 10)])
    assert res.answer == "Paris"


def test_yarn_rope_parameters_hand_worked():
    params, window = yarn_rope({"rope_theta": 1e6, "rope_type": "default", "type": "default"}, 32768, 4.0)
    assert params == {"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    assert window == 131072


def test_yarn_factor_reaches_the_transformers_model(tiny_model_dir):
    b = TransformersBackend.from_pretrained(tiny_model_dir, device="cpu", dtype="float32", yarn_factor=2.0)
    rope = b.model.config.rope_parameters
    assert (rope["rope_type"], rope["factor"], rope["original_max_position_embeddings"]) == ("yarn", 2.0, 16384)
    assert b.max_window == 32768
    assert len(b.generate(["hello"], SamplingParams(2))[0].token_ids) >= 1


def test_yarn_factor_and_chat_template_kwargs_reach_the_vllm_engine(monkeypatch, tiny_model_dir, tiny_backend,
                                                                      thinking_tokenizer):
    seen = {}

    class Engine:
        def __init__(self, **kw):
            seen.update(kw)
            self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=kw["max_model_len"]))

        def get_tokenizer(self):
            return thinking_tokenizer

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=Engine))
    from memagent.backends.vllm import VLLMBackend

    b = VLLMBackend(str(tiny_model_dir), yarn_factor=4.0, chat_template_kwargs={"enable_thinking": False})
    assert seen["hf_overrides"]["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0,
                                                    "original_max_position_embeddings": 16384}
    assert seen["hf_overrides"]["rope_parameters"]["rope_theta"] == 10000.0
    assert seen["max_model_len"] == b.max_window == 65536
    assert thinking_tokenizer.decode(b.encode("hi")) == "<u>hi</u><nothink><a>"
