"""RULER out-of-domain tasks: lengths, hidden items present, answers right, deterministic."""
from __future__ import annotations

import json
import random
import re
from collections import Counter

import pytest
from qa_fixtures import WORDS

from memagent.tasks.haystack import fit_to_tokens, insert_at_depths, make_keys, pseudo_words
from memagent.tasks.ruler import TASKS, synthesize_ruler
from memagent.tasks.schema import DataError, count_tokens, write_samples

TARGET = 4000  # uuid needles are ~70 tiny-tokenizer tokens: 2% needs >= 3500


@pytest.fixture(scope="module")
def essay(tmp_path_factory):
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("essay") / "essay.txt"
    sentences = [" ".join(rng.choice(WORDS) for _ in range(9)).capitalize() + "." for _ in range(40)]
    path.write_text("\n".join(" ".join(sentences[i : i + 4]) for i in range(0, 40, 4)), encoding="utf-8")
    return path


def _make(task, tokenizer, essay=None, seed=0, samples=2, tokens=(TARGET,), **kw):
    return list(synthesize_ruler(task, tokens=list(tokens), samples=samples, seed=seed, tokenizer=tokenizer,
                                 tokenizer_name="tiny", haystack_file=essay, **kw))


@pytest.mark.parametrize("task", [t for t in TASKS if t != "qa_squad"])
def test_every_task_hits_length_and_hides_its_answers(task, tokenizer, essay):
    out = _make(task, tokenizer, essay)
    assert [s["id"] for s in out] == [f"{task}-tokens{TARGET}-0000", f"{task}-tokens{TARGET}-0001"]
    for s in out:
        n = count_tokens(tokenizer, s["context"])
        assert n == s["num_tokens"] and abs(n - TARGET) <= 0.02 * TARGET, (task, n)
        assert s["answers"] and all(a in s["context"] for a in s["answers"])
        assert s["metric"] == "string_match_all" and s["task"] == task and s["length"] == TARGET
    assert out[0]["context"] != out[1]["context"]


@pytest.mark.parametrize("task", ["niah_multikey_2", "vt", "cwe", "fwe"])
def test_same_seed_identical_bytes(task, tokenizer, tmp_path):
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    write_samples(_make(task, tokenizer, seed=1, samples=1), a)
    write_samples(_make(task, tokenizer, seed=1, samples=1), b)
    write_samples(_make(task, tokenizer, seed=2, samples=1), c)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def test_niah_variants(tokenizer, essay):
    (single,) = _make("niah_single_1", tokenizer, samples=1)
    assert single["context"].count("One of the special magic numbers for") == 1
    assert single["context"].count("The grass is green.") > 10
    assert f"for {single['keys'][0]} mentioned" in single["question"]
    (mk,) = _make("niah_multikey_1", tokenizer, essay, samples=1)
    assert mk["context"].count("One of the special magic numbers") == 4 and len(mk["answers"]) == 1
    assert f"magic numbers for {mk['keys'][0]} is: {mk['answers'][0]}." in mk["context"]
    (mv,) = _make("niah_multivalue", tokenizer, essay, samples=1)
    assert len(mv["answers"]) == 4 and mv["context"].count(f"for {mv['keys'][0]} is:") == 4
    (mq,) = _make("niah_multiquery", tokenizer, essay, samples=1)
    assert len(mq["answers"]) == 4 and all(k in mq["question"] for k in mq["keys"])
    (uu,) = _make("niah_multikey_3", tokenizer, samples=1)
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", uu["answers"][0])
    haystack_needles = re.findall(r"magic uuids for ([0-9a-f-]+) is", uu["context"])
    assert len(haystack_needles) > 5 and len(set(haystack_needles)) == len(haystack_needles)  # keys distinct
    assert haystack_needles.count(uu["keys"][0]) == 1


def test_vt_chain_in_order(tokenizer):
    (s,) = _make("vt", tokenizer, samples=1)
    names = s["answers"]
    value = re.search(r"assigned the value (\d+)", s["question"]).group(1)
    assert f"VAR {names[0]} = {value}." in s["context"]
    positions = [s["context"].index(f"VAR {names[i + 1]} = VAR {names[i]}.") for i in range(4)]
    assert positions == sorted(positions) and s["context"].index(f"VAR {names[0]} =") < positions[0]


def test_cwe_counts(tokenizer):
    (s,) = _make("cwe", tokenizer, samples=1)
    counts = Counter(re.findall(r"\d+\. (\w+)", s["context"]))
    assert all(counts[w] == 30 for w in s["answers"]) and len(s["answers"]) == 10
    assert set(counts.values()) == {30, 3}
    assert {w for w, c in counts.items() if c == 30} == set(s["answers"])


def test_fwe_answers_are_the_top_three(tokenizer):
    (s,) = _make("fwe", tokenizer, samples=1, tokens=(3000,))
    counts = Counter(w for w in s["context"].split() if w != "....")
    top = [w for w, _ in counts.most_common(3)]
    assert set(top) == set(s["answers"])
    assert counts[s["answers"][0]] > counts[s["answers"][1]] > counts[s["answers"][2]]


def test_qa_squad(tokenizer, squad_file):
    out = _make("qa_squad", tokenizer, samples=3, tokens=(2000,), source=squad_file)
    data = json.loads(squad_file.read_text())
    contexts = {p["context"] for a in data["data"] for p in a["paragraphs"]}
    for s in out:
        assert abs(count_tokens(tokenizer, s["context"]) - 2000) <= 40 and s["metric"] == "sub_em"
        (pos,) = s["gold_docs"]
        block = s["context"].split("\n\n")[pos - 1]
        assert block.startswith(f"Document {pos}:\n") and s["answers"][0] in block
        assert block.split("\n", 1)[1] in contexts
        assert s["question"] != "Unanswerable?"  # is_impossible questions are skipped


def test_errors_are_clear(tokenizer, tmp_path):
    with pytest.raises(DataError, match="unknown RULER task 'niah'; choose one of: niah_single_1"):
        _make("niah", tokenizer)
    with pytest.raises(DataError, match="--haystack-file"):
        _make("niah_single_2", tokenizer)
    assert _make("niah_single_2", tokenizer, samples=1, haystack="noise")[0]["answers"]
    with pytest.raises(DataError, match="applies to the niah_"):
        _make("vt", tokenizer, haystack="noise")
    with pytest.raises(DataError, match="needs a SQuAD-format JSON"):
        _make("qa_squad", tokenizer)
    with pytest.raises(DataError, match="over the target 5"):
        _make("vt", tokenizer, tokens=(5,))
    bad = tmp_path / "bad_squad.json"
    bad.write_text(json.dumps({"data": [{"paragraphs": [{"context": "x", "qas": []}]}, {"paragraphs": [{"qas": []}]}]}))
    with pytest.raises(DataError, match="SQuAD article #1 .*'context'"):
        _make("qa_squad", tokenizer, source=bad)


def test_fit_to_tokens_picks_the_closest_size(tokenizer):
    n, text, tokens = fit_to_tokens(lambda n: "alpha beta " * n, tokenizer, 1001)
    per = count_tokens(tokenizer, "alpha beta " * 100) / 100
    assert abs(tokens - 1001) <= per / 2 + 1 and text == "alpha beta " * n


def test_helpers():
    assert insert_at_depths(["a", "b", "c", "d"], ["X", "Y"], [0.0, 0.5]) == ["X", "a", "b", "Y", "c", "d"]
    keys = make_keys(random.Random(0), 500)
    assert len(set(keys)) == 500 and all(re.fullmatch(r"[a-z]+-[a-z]+", k) for k in keys)
    words = pseudo_words(random.Random(0), 2000)
    assert len(set(words)) == 2000 and all(len(w) == 6 for w in words)


def test_needle_haystack_runs_out_of_keys_clearly(tokenizer, monkeypatch):
    import memagent.tasks.haystack as hs
    import memagent.tasks.ruler as ruler

    monkeypatch.setattr(ruler, "ADJECTIVES", hs.ADJECTIVES[:2])
    monkeypatch.setattr(ruler, "NOUNS", hs.NOUNS[:3])
    monkeypatch.setattr(hs, "ADJECTIVES", hs.ADJECTIVES[:2])
    monkeypatch.setattr(hs, "NOUNS", hs.NOUNS[:3])
    with pytest.raises(DataError, match="ran out of distinct items after 5"):  # 6 keys, 1 hidden
        _make("niah_multikey_2", tokenizer, samples=1, tokens=(2000,))
