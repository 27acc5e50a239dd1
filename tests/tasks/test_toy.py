import pytest

from memagent.agent.chunking import iter_chunks
from memagent.tasks.toy import MARKER, ToySpec, build_toy_tokenizer, make_samples


@pytest.fixture(scope="module")
def toy_tok():
    return build_toy_tokenizer(ToySpec())


def test_samples_are_deterministic_and_hold_the_fact_exactly_once(toy_tok):
    spec = ToySpec(n_keys=20, n_values=30, facts=2, slots=4)
    a = make_samples(spec, 5, 50, seed=7)
    assert a == make_samples(spec, 5, 50, seed=7) and a != make_samples(spec, 5, 50, seed=8)
    for s in a:
        words = s["context"].split()
        assert len(words) == 5 * spec.chunk_tokens == 5 * 3 * 4
        facts = [(i, words[i + 1], words[i + 2]) for i in range(0, len(words), 3) if words[i] == MARKER]
        assert len(facts) == 5 * 2  # `facts` marked facts per chunk
        asked = [f for f in facts if f[1] == s["question"]]
        assert len(asked) == 1  # the asked key appears in exactly one fact
        i, _, value = asked[0]
        assert value == s["answers"][0] and i // spec.chunk_tokens == s["gold_chunk"]


def test_the_workflow_chunker_cuts_at_chunk_boundaries(toy_tok):
    spec = ToySpec()
    [s] = make_samples(spec, 6, 1, seed=0)
    chunks = list(iter_chunks(s["context"], toy_tok, spec.chunk_tokens))
    assert len(chunks) == 6 and all(len(c.token_ids) == spec.chunk_tokens for c in chunks)
    assert " ".join(c.text for c in chunks) == s["context"]  # every toy word is one token
    assert all(c.text.split().count(MARKER) == spec.facts for c in chunks)


def test_bad_spec_is_rejected():
    with pytest.raises(ValueError, match="facts"):
        ToySpec(facts=4, slots=3)


def test_toy_tokenizer_round_trips_answers(toy_tok, tmp_path):
    from transformers import AutoTokenizer

    from memagent.agent.answer import extract_boxed

    ids = toy_tok("M k3 v7 Q k3 > \\boxed{ v7 }")["input_ids"]
    assert len(ids) == 9 and extract_boxed(toy_tok.decode(ids)) == "v7"
    toy_tok.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path)("k1 v2 \\boxed{ v3 }")["input_ids"] == toy_tok("k1 v2 \\boxed{ v3 }")["input_ids"]


def test_data_toy_cli_writes_deterministic_jsonl(tmp_path, monkeypatch):
    import json
    import sys

    from memagent.cli import main

    def run(path):
        monkeypatch.setattr(sys, "argv", ["memagent", "data", "toy", "--chunks", "2,5", "--samples", "3",
                                          "--seed", "4", "--out", str(path)])
        with pytest.raises(SystemExit) as e:
            main()
        assert e.value.code in (0, None)

    run(tmp_path / "a.jsonl")
    run(tmp_path / "b.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    rows = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert [r["num_chunks"] for r in rows] == [2, 2, 2, 5, 5, 5]
    assert all(len(r["context"].split()) == r["num_chunks"] * ToySpec().chunk_tokens for r in rows)
