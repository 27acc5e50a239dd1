"""`memagent demo --task two-hop --quick` end to end through the real CLI (slow: under a minute on 2 free
cores): its files, their structure, and that the numbers come from real runs (the accuracy targets are
the full run's, not checked here). Plus the flag's refusals (fast)."""
import json
import math
import sys

import pytest

from memagent.cli import main, run
from memagent.tasks.toy import ToySpec, make_samples

SEED = 1234  # the CI seed (not a tuning or an evaluation seed)
TRAIN_CHUNKS, MULTS, DOCS, LOOKUPS, HITS, K = 4, ("1", "4"), 24, 2, 1, 4  # TwoHopConfig.for_run(quick=True)


@pytest.fixture(scope="module")
def two_hop(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo2") / "run"
    argv = sys.argv
    sys.argv = ["memagent", "demo", "--task", "two-hop", "--quick", "--seed", str(SEED), "--out", str(out)]
    try:
        with pytest.raises(SystemExit) as e:
            main()
        assert e.value.code in (0, None)
    finally:
        sys.argv = argv
    return out


def _metrics(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_two_hop_quick_writes_a_table_split_by_order(two_hop):
    results = json.loads((two_hop / "results.json").read_text())
    assert results["task"] == "two-hop" and results["seed"] == SEED and results["chance"] == 1 / 50
    acc = results["accuracy"]
    assert list(acc) == ["lookup-rl", "memagent-rl", "skim", "full-context"]
    # every share is a count of right answers over that order's documents of the evaluation set
    for mult in MULTS:
        samples = make_samples(ToySpec(), TRAIN_CHUNKS * int(mult), DOCS, SEED + 10_000, prefix="eval", two_hop=True)
        n = {o: sum(s["order"] == o for s in samples) for o in ("value-first", "pointer-first")}
        assert sum(n.values()) == DOCS and min(n.values()) > 0
        for method, orders in acc.items():
            assert set(orders) == {"value-first", "pointer-first", "all"}
            right = {o: orders[o][mult] * n[o] for o in n}
            assert all(math.isclose(r, round(r), abs_tol=1e-9) for r in right.values()), (method, mult)
            assert math.isclose(orders["all"][mult] * DOCS, sum(right.values()), abs_tol=1e-9)
    calls = results["calls_per_doc"]
    for mult in MULTS:
        chunks = TRAIN_CHUNKS * int(mult)
        assert calls["memagent-rl"][mult] == chunks + 1  # every chunk, then the answer
        assert calls["skim"][mult] == min(K, chunks) + 1  # the top k chunks, then the answer
        # + each lookup's query and its hits (0..HITS), then the answer
        assert chunks + LOOKUPS + 1 <= calls["lookup-rl"][mult] <= chunks + LOOKUPS * (1 + HITS) + 1
        assert calls["full-context"][mult] == 1
    assert {"lookup", "memagent", "full_context", "eval", "total"} <= set(results["seconds"])
    table = (two_hop / "results.md").read_text()
    assert "two-hop toy QA accuracy" in table and "| lookup-rl (value-first) |" in table
    assert "| memagent-rl (pointer-first) |" in table and "4x (16 chunks)" in table
    assert "model calls per document" in table
    assert (two_hop / "accuracy.png").stat().st_size > 1000
    assert (two_hop / "model" / "model.safetensors").is_file() and (two_hop / "model" / "memagent.json").is_file()


@pytest.mark.slow
def test_the_saved_lookup_model_answers_through_ask_with_its_profile(two_hop, tmp_path):
    """`memagent ask --model OUT/model --workflow lookup --profile OUT/model/lookup-profile.yaml` reads with the
    demo's query template and rounds: the trace has its two query calls, in the toy template."""
    sample = make_samples(ToySpec(), TRAIN_CHUNKS, 1, 7, prefix="ask", two_hop=True)[0]
    doc, trace = tmp_path / "doc.txt", tmp_path / "trace.jsonl"
    doc.write_text(sample["context"])
    code = run(["ask", "--model", str(two_hop / "model"), "--document", str(doc), "--question", sample["question"],
                "--workflow", "lookup", "--profile", str(two_hop / "model" / "lookup-profile.yaml"),
                "--trace", str(trace), "--no-progress"])
    assert code == 0
    queries = [r for r in map(json.loads, trace.read_text().splitlines()) if r.get("kind") == "query"]
    assert len(queries) == LOOKUPS and all(len(q["hits"]) <= HITS for q in queries)
    # "M m1 m2 Q k S >": 7 tokens (the built-in English template is over 60 with the toy tokenizer)
    assert [q["prompt_tokens"] for q in queries] == [7, 7]


@pytest.mark.slow
def test_two_hop_quick_trains_both_workflows_with_multi_conv_dapo(two_hop):
    """The lookup model's rollouts train more conversations per sample than the chunks and the answer (its
    query call and the hits it read); memagent's exactly the chunks and the answer."""
    look = _metrics(two_hop / "lookup" / "rl" / "metrics.jsonl")
    mem = _metrics(two_hop / "memagent" / "rl" / "metrics.jsonl")
    assert len(look) == len(mem) == 4  # the same step budget
    assert all(m["conversations_per_sample"] == TRAIN_CHUNKS + 1 for m in mem)
    assert all(m["conversations_per_sample"] > TRAIN_CHUNKS + 1 for m in look)
    assert all(m["conversations_per_sample"] <= TRAIN_CHUNKS + LOOKUPS * (1 + HITS) + 1 for m in look)
    chosen = json.loads((two_hop / "lookup" / "rl" / "config.json").read_text())["workflow"]  # {name, options}
    assert chosen["name"] == "lookup" and chosen["options"]["lookups"] == LOOKUPS


@pytest.mark.parametrize("argv, part", [
    (["--task", "three-hop"], "--task must be one of single-hop, two-hop"),
    (["--task", "two-hop", "--seeds", "100,101"], "--seeds runs the single-hop demo only"),
])
def test_demo_task_refusals(tmp_path, capsys, argv, part):
    code = run(["demo", "--quick", "--out", str(tmp_path / "x"), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and part in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()
