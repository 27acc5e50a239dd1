import json
import math
import re

import pytest

from memagent.agent.workflow import AgentInput, BudgetError, MemoryAgent, cap_tokens, cap_tokens_many
from memagent.backends.base import SamplingParams
from memagent.config import AgentConfig

from fakes import ScriptedBackend

TEMPLATE_MEM = "Q:{question}|M:{memory}|C:{chunk}|"
TEMPLATE_FIN = "Q:{question}|M:{memory}|A:"


def _config(**kw):
    base = dict(chunk_tokens=20, memory_tokens=8, answer_tokens=8, query_tokens=16,
                memory_template=TEMPLATE_MEM, final_template=TEMPLATE_FIN, empty_memory="EMPTY")
    base.update(kw)
    return AgentConfig(**base)


def _doc(n_words: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i % 50}" for i in range(n_words))


def test_each_memory_prompt_holds_only_the_previous_memory_and_the_current_chunk(tiny_tokenizer, tmp_path):
    step = {"n": 0}

    def reply(prompt, call):
        if prompt.startswith("Q:") and "|C:" in prompt:
            step["n"] += 1
            return f"memo{step['n']}"
        return "\\boxed{yes}"

    backend = ScriptedBackend(tiny_tokenizer, reply)
    doc = _doc(300)
    trace = tmp_path / "t.jsonl"
    [res] = MemoryAgent(backend, _config(), trace_path=trace, keep_conversations=True).run([AgentInput("what?", doc, "d")])
    total = len(tiny_tokenizer(doc, add_special_tokens=False)["input_ids"])
    k = math.ceil(total / 20)
    prompts = [p for b in backend.batches for p in b]
    assert len(prompts) == k + 1  # one call per chunk plus the final answer
    chunk_texts = [tiny_tokenizer.decode(tiny_tokenizer(doc, add_special_tokens=False)["input_ids"][i : i + 20])
                   for i in range(0, total, 20)]
    for i, p in enumerate(prompts[:-1]):
        expected_memory = "EMPTY" if i == 0 else f"memo{i}"
        assert p == f"Q:what?|M:{expected_memory}|C:{chunk_texts[i]}|"  # nothing else: no older memory, no other chunk
    assert prompts[-1] == f"Q:what?|M:memo{k}|A:"
    assert res.answer == "yes" and res.num_chunks == k and res.memory == f"memo{k}"
    assert [c.kind for c in res.conversations] == ["memory"] * k + ["final"]
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(records) == k + 1
    assert all(r["chunk_tokens"] <= 20 and r["memory_tokens"] <= 8 for r in records[:-1])
    assert records[-1]["kind"] == "final" and records[-1]["answer"] == "yes"
    for key in ("doc_id", "step", "chunk_tokens", "prompt_tokens", "memory_tokens", "memory", "truncated", "seconds"):
        assert key in records[0]


def test_memory_is_capped_at_m_tokens_when_the_backend_over_produces(tiny_tokenizer, tmp_path):
    long_reply = " ".join(["city river memory"] * 40)
    backend = ScriptedBackend(tiny_tokenizer, lambda p, c: long_reply if "|C:" in p else "\\boxed{x}")
    trace = tmp_path / "t.jsonl"
    [res] = MemoryAgent(backend, _config(memory_tokens=8), trace_path=trace).run([AgentInput("q", _doc(60))])
    records = [json.loads(line) for line in trace.read_text().splitlines()][:-1]
    assert all(r["truncated"] and r["memory_tokens"] == 8 for r in records)
    assert len(tiny_tokenizer(res.memory, add_special_tokens=False)["input_ids"]) == 8
    assert long_reply.startswith(res.memory)
    # the generation itself is capped at M new tokens
    assert all(p.max_new_tokens == 8 for p in backend.params[:-1]) and backend.params[-1].max_new_tokens == 8


def test_cap_tokens_never_exceeds_the_limit(tiny_tokenizer):
    text = "東京 música " * 50
    for limit in (1, 2, 3, 7, 30):
        cut, n, truncated = cap_tokens(text, tiny_tokenizer, limit)
        assert truncated and n <= limit
        assert len(tiny_tokenizer(cut, add_special_tokens=False)["input_ids"]) <= limit


def test_cap_tokens_many_equals_one_by_one(tiny_tokenizer):
    texts = ["", "short", "東京 música " * 50, "a b c d e f g h", "東京"]
    for limit in (1, 3, 7):
        many = cap_tokens_many(texts, tiny_tokenizer, limit)
        assert many == [cap_tokens(t, tiny_tokenizer, limit) for t in texts]
        assert [t for t, _, cut in many if cut] and [t for t, _, cut in many if not cut]  # both paths taken


def test_no_boxed_answer_is_an_explicit_none(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, lambda p, c: "I think it is Paris")
    [res] = MemoryAgent(backend, _config()).run([AgentInput("q", _doc(10))])
    assert res.answer is None and res.raw_answer == "I think it is Paris"


def test_empty_document_answers_from_empty_memory_with_a_warning(tiny_tokenizer, caplog):
    backend = ScriptedBackend(tiny_tokenizer, lambda p, c: "\\boxed{unknown}")
    with caplog.at_level("WARNING"):
        [res] = MemoryAgent(backend, _config()).run([AgentInput("q", "", "empty")])
    assert "empty" in caplog.text
    assert res.num_chunks == 0 and res.answer == "unknown"
    assert backend.batches == [["Q:q|M:EMPTY|A:"]]


def test_question_over_budget_fails_before_any_call(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, lambda p, c: "x")
    with pytest.raises(BudgetError, match="over its budget of 16"):
        MemoryAgent(backend, _config()).run([AgentInput("why " * 40, _doc(10), "long-q")])
    assert backend.batches == []


def test_window_too_small_fails_before_any_call(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, lambda p, c: "x", max_window=40)
    with pytest.raises(BudgetError, match="window is 40"):
        MemoryAgent(backend, _config()).run([AgentInput("q", _doc(10))])
    assert backend.batches == []


def test_documents_of_different_lengths_share_batches_and_finish_at_different_steps(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, lambda p, c: "m" if "|C:" in p else "\\boxed{" + re.search(r"Q:(\w+)", p).group(1) + "}")
    lengths = [5, 200, 60, 0, 120]
    items = [AgentInput(f"q{i}", _doc(n), f"d{i}") for i, n in enumerate(lengths)]
    results = MemoryAgent(backend, _config(max_batch_docs=3)).run(items)
    assert [r.answer for r in results] == [f"q{i}" for i in range(5)]  # input order kept
    assert max(len(b) for b in backend.batches) == 3  # documents batched together
    n_calls = sum(len(b) for b in backend.batches)
    assert n_calls == sum(r.num_chunks + 1 for r in results)


def test_batched_equals_one_by_one_under_greedy_decoding(tiny_backend):
    cfg = AgentConfig(chunk_tokens=24, memory_tokens=6, answer_tokens=6, query_tokens=16)
    docs = [_doc(n, tag) for n, tag in ((30, "city"), (90, "river"), (10, "film"), (55, "key"))]
    items = [AgentInput(f"where is {i}?", d, str(i)) for i, d in enumerate(docs)]
    batched = MemoryAgent(tiny_backend, AgentConfig(**{**cfg.__dict__, "max_batch_docs": 4}), keep_conversations=True).run(items)
    single = [MemoryAgent(tiny_backend, cfg, keep_conversations=True).run([it])[0] for it in items]
    for b, s in zip(batched, single):
        assert b.raw_answer == s.raw_answer and b.memory == s.memory
        assert [c.response_ids for c in b.conversations] == [c.response_ids for c in s.conversations]


def test_sampling_params_are_validated():
    with pytest.raises(ValueError):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ValueError):
        SamplingParams(max_new_tokens=4, top_p=0.0)


def test_the_random_tiny_model_writes_varied_text(tiny_backend):
    # guards the batching test above against a degenerate model that always writes the same token
    gens = tiny_backend.generate(["city river", "memory key value"], SamplingParams(max_new_tokens=8))
    assert all(len(set(g.token_ids)) >= 3 for g in gens)


def test_a_starting_memory_replaces_the_empty_one_and_must_fit_its_budget(tiny_tokenizer):
    def reply(prompt, call):  # count the chunks read so far: "EMPTY" -> memo1 -> memo2 ...
        if "|C:" not in prompt:
            return "\\boxed{" + re.search(r"M:(\w+)", prompt).group(1) + "}"
        m = re.search(r"M:(\w+)", prompt).group(1)
        return f"memo{1 if m == 'EMPTY' else int(m[4:]) + 1}"

    backend = ScriptedBackend(tiny_tokenizer, reply)
    agent = MemoryAgent(backend, _config())
    [first] = agent.run([AgentInput("q", _doc(30), "a")])
    [later] = agent.run([AgentInput("q", _doc(30), "b", memory=first.memory)])  # go on reading
    assert first.num_chunks == later.num_chunks > 1 and first.memory == f"memo{first.num_chunks}"
    assert later.memory == f"memo{2 * first.num_chunks}" and later.answer == later.memory
    assert backend.batches[-1 - later.num_chunks][0].startswith(f"Q:q|M:{first.memory}|C:")
    calls = len(backend.batches)
    with pytest.raises(BudgetError, match="starting memory of document big has .* over the memory budget of 8"):
        agent.run([AgentInput("q", _doc(10), "big", memory=_doc(40))])
    assert len(backend.batches) == calls  # refused before any call
