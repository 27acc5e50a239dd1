"""RULER-HotpotQA synthesis options: fixed vs random placement, first vs shuffle selection, the official filter."""
from __future__ import annotations

import json
import random
import re

import pytest
from typer.testing import CliRunner

from memagent.backends.base import Generation
from memagent.cli import app
from memagent.tasks.closed_book import closed_book_filter
from memagent.tasks.corpora import load_hotpotqa
from memagent.tasks.ruler_hqa import select_entries, synthesize_ruler_hqa
from memagent.tasks.schema import DataError, read_samples

DOC = re.compile(r"Document (\d+):\n(.*?)(?=\n\nDocument \d+:\n|\Z)", re.S)


@pytest.fixture
def small_hotpot(tmp_path):
    """8 questions of 4 paragraphs each; the gold ones are the 2nd and 4th in file order."""
    data = []
    for q in range(8):
        context = [[f"T{q}-{j}", [f"Para {j} of question {q}."]] for j in range(4)]
        data.append({"_id": f"h{q}", "question": f"Question {q}?", "answer": f"ans{q}",
                     "supporting_facts": [[f"T{q}-1", 0], [f"T{q}-3", 0]], "context": context})
    path = tmp_path / "hotpot_hand.json"
    path.write_text(json.dumps(data))
    return path


def _docs(sample) -> list[str]:
    found = DOC.findall(sample["context"])
    assert [int(n) for n, _ in found] == list(range(1, len(found) + 1))
    return [text for _, text in found]


def test_fixed_placement_puts_own_paragraphs_in_the_same_slots(small_hotpot):
    corpus = load_hotpotqa(small_hotpot)
    samples = list(synthesize_ruler_hqa(corpus, samples=8, seed=4, num_docs=[12], placement="fixed"))
    order = list(range(12))
    random.Random(4).shuffle(order)  # the official data's permutation: random.Random(4).shuffle(all_docs)
    slot = {k: order.index(k) + 1 for k in range(4)}  # own paragraph k (file order) lands in document slot[k]
    for s in samples:
        q = int(s["source_id"][1:])
        docs = _docs(s)
        for k in range(4):
            assert docs[slot[k] - 1] == f"T{q}-{k}\nPara {k} of question {q}."
        assert s["gold_docs"] == sorted([slot[1], slot[3]])
    assert len({tuple(s["gold_docs"]) for s in samples}) == 1


def test_random_placement_moves_gold_between_samples(small_hotpot):
    corpus = load_hotpotqa(small_hotpot)
    samples = list(synthesize_ruler_hqa(corpus, samples=8, seed=4, num_docs=[12]))
    assert len({tuple(s["gold_docs"]) for s in samples}) > 1
    for s in samples:  # the gold paragraphs are still in the recorded slots
        q = int(s["source_id"][1:])
        docs = _docs(s)
        assert {docs[p - 1] for p in s["gold_docs"]} == {f"T{q}-1\nPara 1 of question {q}.",
                                                         f"T{q}-3\nPara 3 of question {q}."}


def test_fixed_placement_with_token_targets_keeps_the_slots(small_hotpot, tokenizer):
    corpus = load_hotpotqa(small_hotpot)
    samples = list(synthesize_ruler_hqa(corpus, samples=4, seed=9, tokens=[160], tokenizer=tokenizer,
                                        placement="fixed"))
    for s in samples:
        order = list(range(s["num_docs"]))
        random.Random(9).shuffle(order)
        q = int(s["source_id"][1:])
        assert s["gold_docs"] == sorted([order.index(1) + 1, order.index(3) + 1])
        assert _docs(s)[order.index(3)] == f"T{q}-3\nPara 3 of question {q}."


def test_first_takes_file_order_and_filters_in_it(small_hotpot):
    corpus = load_hotpotqa(small_hotpot)
    first = select_entries(corpus, 3, seed=0, select="first")
    assert [e.source_id for e in first] == ["h0", "h1", "h2"]
    shuffled = select_entries(corpus, 8, seed=0)
    assert [e.source_id for e in shuffled] != [f"h{q}" for q in range(8)]  # a seeded order, not the file's
    even_known = lambda batch: [e.index % 2 == 0 for e in batch]  # noqa: E731
    kept = select_entries(corpus, 3, seed=0, answered_without_context=even_known, select="first", batch_size=2)
    assert [e.source_id for e in kept] == ["h1", "h3", "h5"]
    with pytest.raises(DataError, match="unknown selection 'last'"):
        select_entries(corpus, 3, seed=0, select="last")
    with pytest.raises(DataError, match="unknown placement 'middle'"):
        list(synthesize_ruler_hqa(corpus, samples=1, seed=0, num_docs=[4], placement="middle"))


class Scripted:
    """A fake backend: reply r of each question is `script(model, question, seed)`; records what was asked."""

    tokenizer, max_window = None, None

    def __init__(self, name, script):
        self.name, self.script, self.calls = name, script, []

    def generate(self, prompts, params):
        self.calls.append((len(prompts), params.temperature, params.top_p, params.seed, params.max_new_tokens))
        return [Generation(text=self.script(self.name, re.search(r"Question (\d)", p).group(1), params.seed))
                for p in prompts]


def _reply(model, q, seed):
    if q == "0" and model == "base" and seed == 6:  # the base model's second reply knows it, raw
        return "\\boxed{unsure} though maybe ans0"
    if q == "1" and model == "inst" and seed == 5:  # the instruct model boxes it with odd case and spaces
        return "\\boxed{ ANS 1 }"
    if q == "2" and model == "inst" and seed == 5:  # plain sentence with the answer
        return "It is ans2."
    return "\\boxed{no idea}"


def test_official_style_filter_models_replies_rules(small_hotpot):
    corpus = load_hotpotqa(small_hotpot)
    entries = corpus.entries[:4]
    base, inst = Scripted("base", _reply), Scripted("inst", _reply)
    answered = closed_book_filter([base, inst], 512, replies=2, temperature=1.0, top_p=0.7, seed=5,
                                  rules=["substring", "boxed"])
    # q0: raw substring in the base model's 2nd reply; q1: boxed after lower-casing and squashing spaces;
    # q2: substring of a plain reply; q3: never
    assert answered(entries) == [True, True, True, False]
    assert base.calls == inst.calls == [(4, 1.0, 0.7, 5, 512), (4, 1.0, 0.7, 6, 512)]  # 2 replies, seeds 5 and 6
    ours = closed_book_filter([base, inst], replies=2, seed=5)  # sub_em on the boxed answer
    assert ours(entries) == [False, False, True, False]
    one_reply = closed_book_filter([base, inst], replies=1, seed=5, rules=["substring"])
    assert one_reply(entries) == [False, False, True, False]  # q0 needs the second reply; q1 is "ans 1"
    with pytest.raises(DataError, match="unknown filter rule"):
        closed_book_filter([base], rules=["fuzzy"])


def test_cli_options_with_the_tiny_model(small_hotpot, tiny_model_dir, tmp_path):
    out = tmp_path / "hqa.jsonl"
    result = CliRunner().invoke(app, [
        "data", "ruler-hqa", "--source", str(small_hotpot), "--num-docs", "12", "--samples", "3", "--seed", "4",
        "--placement", "fixed", "--select", "first", "--filter-model", str(tiny_model_dir),
        "--filter-model", str(tiny_model_dir), "--filter-replies", "2", "--filter-temperature", "1.0",
        "--filter-top-p", "0.7", "--filter-max-tokens", "4", "--filter-rule", "substring", "--filter-rule", "boxed",
        "--out", str(out)])
    assert result.exit_code == 0, result.output
    samples = list(read_samples(out))
    assert [s["source_id"] for s in samples] == ["h0", "h1", "h2"]  # random weights know no answer
    assert len({tuple(s["gold_docs"]) for s in samples}) == 1


def test_cli_filter_flags_reach_the_filter(small_hotpot, tmp_path, monkeypatch):
    import memagent.backends

    made = {}

    def fake_load_backend(name, model, **kwargs):
        made[model] = (name, kwargs, Scripted(model, _reply))
        return made[model][2]

    monkeypatch.setattr(memagent.backends, "load_backend", fake_load_backend)
    out = tmp_path / "hqa.jsonl"
    result = CliRunner().invoke(app, [
        "data", "ruler-hqa", "--source", str(small_hotpot), "--num-docs", "12", "--samples", "4", "--seed", "5",
        "--select", "first", "--filter-model", "base", "--filter-model", "inst", "--filter-backend", "openai",
        "--filter-base-url", "http://127.0.0.1:9/v1", "--filter-base-url", "http://127.0.0.1:10/v1", "--filter-replies", "2", "--filter-temperature", "1.0",
        "--filter-top-p", "0.7", "--filter-max-tokens", "512", "--filter-rule", "substring", "--filter-rule", "boxed",
        "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert [s["source_id"] for s in read_samples(out)] == ["h3", "h4", "h5", "h6"]  # h0, h1, h2 answered closed-book
    assert made["base"][:2] == ("openai", {"base_url": "http://127.0.0.1:9/v1"})
    assert made["inst"][:2] == ("openai", {"base_url": "http://127.0.0.1:10/v1"})
    assert made["inst"][2].calls[:2] == [(8, 1.0, 0.7, 5, 512), (8, 1.0, 0.7, 6, 512)]


@pytest.mark.parametrize("flags, says", [
    (["--filter-rule", "fuzzy"], "unknown --filter-rule"),
    (["--filter-replies", "0"], "--filter-replies must be a positive integer, got 0"),
    (["--filter-top-p", "1.5"], "--filter-top-p must be in (0, 1], got 1.5"),
    (["--placement", "middle"], "unknown placement"),
    (["--select", "last"], "unknown selection"),
])
def test_cli_bad_synthesis_flags_are_one_line_errors(small_hotpot, tmp_path, flags, says):
    result = CliRunner().invoke(app, ["data", "ruler-hqa", "--source", str(small_hotpot), "--num-docs", "12",
                                      "--samples", "2", "--out", str(tmp_path / "x.jsonl"), *flags])
    assert isinstance(result.exception, DataError) and says in str(result.exception)
    assert [p.name for p in tmp_path.iterdir()] == ["hotpot_hand.json"]  # no partial or temporary file left
