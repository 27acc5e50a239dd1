"""Eval records keep every reward's value: the outcome reward of the reply, the step reward of each memory update."""
import json
import re

import pytest
from test_sweep import KeyReader, data_file  # noqa: F401  (the module's fixture)

from memagent.config import AgentConfig
from memagent.eval.rewards import record_rewards
from memagent.eval.sweep import SweepConfig, run_sweep
from memagent.rewards.step import evidence_share
from memagent.tasks.schema import read_samples


def test_records_hold_the_outcome_and_step_rewards(tokenizer, data_file, tmp_path):  # noqa: F811
    agent = AgentConfig(chunk_tokens=80, memory_tokens=32, answer_tokens=16, query_tokens=64, max_batch_docs=4)
    cfg = SweepConfig("reader", methods=["memagent", "full-context"], agent=agent, window=5000,
                      rewards=("boxed", "evidence"))
    records = [json.loads(x) for x in run_sweep(KeyReader(tokenizer), [data_file], tmp_path, cfg).read_text().splitlines()]
    samples = {s["id"]: s for s in read_samples(data_file)}
    right = 0
    for r in records:
        assert r["rewards"]["boxed"] == r["score"]  # the reader answers the fact exactly, or "unknown"
        if r["method"] == "full-context":
            assert "evidence" not in r["rewards"]  # no memory: no step reward
            continue
        s = samples[r["sample_id"]]
        values = r["rewards"]["evidence"]
        assert len(values) == r["tokens"]["calls"] - 1 and all(isinstance(v, float) for v in values)  # one per update
        if r["score"] == 1.0:  # the final memory holds the fact: the rewards add up to its evidence share
            item, answer = re.search(r"item (\d+)", s["question"]).group(1), s["answers"][0]
            final = f"The key of item {item} is {answer}."
            want = evidence_share(final, s["evidence"]) - evidence_share(agent.empty_memory, s["evidence"])
            assert sum(values) == pytest.approx(want) and want >= 0.5  # the fact sentence whole
            right += 1
    assert right >= 1
    # the default sweep (no rewards named) writes records as before
    assert "rewards" not in json.loads(run_sweep(KeyReader(tokenizer), [data_file], tmp_path / "plain",
                                                 SweepConfig("reader", methods=["full-context"], agent=agent,
                                                             window=5000)).read_text().splitlines()[0])


def test_record_rewards_by_hand():
    sample = {"question": "k3", "answers": ["v5"], "evidence": ["k3 k7", "k7 v5"]}
    got = record_rewards(("boxed", "evidence", "answer-recall"), sample, "\\boxed{v5}", ["k3 k7", "k7 v5"], "none")
    assert got == {"rewards": {"boxed": 1.0, "evidence": [0.75, 0.0], "answer-recall": [0.0, 1.0]}}
    no_evidence = record_rewards(("evidence",), {"question": "q", "answers": ["a"]}, "x", ["m"], "none")
    assert no_evidence == {"rewards": {"evidence": [None]}}
    assert record_rewards(("judge", "answer-likelihood", "boxed"), sample, None, None, "none") == \
        {"rewards": {"boxed": 0.0}}  # the judge needs options, the likelihood the policy: left out
    assert record_rewards((), sample, "x", None, "none") == {}
