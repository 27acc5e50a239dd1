"""Two-hop toy questions (memagent.tasks.toy.make_two_hop_sample, `memagent data toy --two-hop`): a pointer fact
and a value fact in two random chunks, the order recorded."""
from __future__ import annotations

import json
import random

from memagent.cli import run
from memagent.tasks.toy import ToySpec, make_samples, make_two_hop_sample

SPEC = ToySpec()


def _facts(chunk: str) -> list[tuple[str, str]]:
    words = chunk.split()
    return [(words[i + 1], words[i + 2]) for i in range(0, len(words), 3) if words[i] == "fact"]


def _chunks(sample: dict) -> list[str]:
    words = sample["context"].split()
    n = SPEC.chunk_tokens
    return [" ".join(words[i:i + n]) for i in range(0, len(words), n)]


def test_a_sample_holds_one_pointer_and_one_value_fact_where_it_says():
    s = make_two_hop_sample(random.Random(3), SPEC, 6, "x")
    chunks = _chunks(s)
    assert len(chunks) == 6 and s["num_chunks"] == 6
    a, v = s["question"], s["answers"][0]
    facts = [(i, k, val) for i, c in enumerate(chunks) for k, val in _facts(c)]
    pointers = [(i, val) for i, k, val in facts if k == a]
    assert len(pointers) == 1 and pointers[0][0] == s["pointer_chunk"]  # "fact A B" once, in its chunk
    b = pointers[0][1]
    assert b in SPEC.keys and b != a
    values = [(i, val) for i, k, val in facts if k == b]
    assert values == [(s["value_chunk"], v)]  # "fact B V" once, in its own chunk
    assert s["pointer_chunk"] != s["value_chunk"]
    assert s["order"] == ("value-first" if s["value_chunk"] < s["pointer_chunk"] else "pointer-first")
    assert s["task"] == "toy-two-hop" and s["metric"] == "exact_match"


def test_orders_are_about_half_each_and_samples_are_deterministic():
    samples = make_samples(SPEC, 16, 400, seed=0, two_hop=True)
    share = sum(s["order"] == "value-first" for s in samples) / len(samples)
    assert 0.42 < share < 0.58  # exactly 1/2 in expectation: two distinct uniform chunks
    assert make_samples(SPEC, 16, 400, seed=0, two_hop=True) == samples
    assert samples[0]["id"] == "toy2-16-00000"
    assert make_samples(SPEC, 16, 3, seed=0) == make_samples(SPEC, 16, 3, seed=0, two_hop=False)  # single-hop unchanged
    assert all("order" not in s for s in make_samples(SPEC, 16, 3, seed=0))


def test_data_toy_two_hop_command(tmp_path, capsys):
    out = tmp_path / "two.jsonl"
    assert run(["data", "toy", "--two-hop", "--chunks", "2,8", "--samples", "5", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["num_chunks"] for r in rows] == [2] * 5 + [8] * 5
    assert {r["order"] for r in rows} <= {"value-first", "pointer-first"}
    capsys.readouterr()
    assert run(["data", "toy", "--two-hop", "--chunks", "1", "--out", str(tmp_path / "bad.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "--two-hop" in err[0]
    assert not (tmp_path / "bad.jsonl").exists()
