"""Samples carry `evidence` (gold supporting strings): the toy tasks, RULER NIAH, RULER-HotpotQA, `data import`."""
import json

import pytest
from qa_fixtures import make_hotpot

from memagent.errors import InputError
from memagent.rl.samples import load_samples
from memagent.tasks.corpora import load_hotpotqa
from memagent.tasks.ruler import synthesize_ruler
from memagent.tasks.ruler_hqa import synthesize_ruler_hqa
from memagent.tasks.schema import DataError, import_released, read_samples
from memagent.tasks.toy import ToySpec, make_samples


def test_toy_samples_carry_their_facts_as_evidence():
    spec = ToySpec()
    for s in make_samples(spec, 4, 20, seed=0):
        [ev] = s["evidence"]
        assert ev == f"{s['question']} {s['answers'][0]}" and f"fact {ev}" in s["context"]
    for s in make_samples(spec, 4, 20, seed=0, two_hop=True):
        pointer, value = s["evidence"]
        a, b = pointer.split()
        assert a == s["question"] and value == f"{b} {s['answers'][0]}"
        assert f"fact {pointer}" in s["context"] and f"fact {value}" in s["context"]


def test_niah_evidence_is_the_queried_needles(tokenizer):
    [s] = synthesize_ruler("niah_multikey_1", tokens=[300], samples=1, seed=0, tokenizer=tokenizer, haystack="noise",
                           tokenizer_name="tiny")
    assert s["evidence"] and all(e in s["context"] for e in s["evidence"])
    assert all(any(a in e for e in s["evidence"]) for a in s["answers"])
    [mq] = synthesize_ruler("niah_multiquery", tokens=[400], samples=1, seed=0, tokenizer=tokenizer, haystack="noise",
                            tokenizer_name="tiny")
    assert len(mq["evidence"]) == len(mq["answers"]) == 4  # one needle per queried key


def test_ruler_hqa_evidence_is_the_supporting_sentences(tmp_path):
    data = make_hotpot(6)
    data[2]["supporting_facts"].append([data[2]["context"][0][0], 99])  # an out-of-range sentence id: no sentence
    path = tmp_path / "hotpot.json"
    path.write_text(json.dumps(data))
    corpus = load_hotpotqa(path)
    samples = list(synthesize_ruler_hqa(corpus, samples=6, seed=0, num_docs=[20]))
    for s in samples:
        raw = next(d for d in data if d["_id"] == s["source_id"])
        want = [raw["context"][0][1][0].strip(), raw["context"][1][1][0].strip()]  # sentence 0 of Topic q-0, q-1
        assert s["evidence"] == want and all(e in s["context"] for e in s["evidence"])
    # the hub's dict-of-lists layout gives the same sentences
    hub = [dict(d, supporting_facts={"title": [t for t, _ in d["supporting_facts"]],
                                     "sent_id": [i for _, i in d["supporting_facts"]]},
                context={"title": [t for t, _ in d["context"]], "sentences": [x for _, x in d["context"]]})
           for d in data]
    (tmp_path / "hub.json").write_text(json.dumps(hub))
    assert [e.evidence for e in load_hotpotqa(tmp_path / "hub.json").entries] == [e.evidence for e in corpus.entries]


def test_data_import_passes_evidence_and_checks_it(tmp_path):
    rec = {"index": 0, "input": "What is the number for blue?", "context": "hay. blue is 42. hay.",
           "outputs": ["42"], "evidence": ["blue is 42."]}
    src = tmp_path / "eval_niah_single_1_4096.json"
    src.write_text(json.dumps([rec]))
    out = tmp_path / "out.jsonl"
    import_released(src, out)
    [s] = read_samples(out)
    assert s["evidence"] == ["blue is 42."]
    src.write_text(json.dumps([dict(rec, evidence="blue is 42.")]))
    with pytest.raises(DataError, match="evidence.*list of strings"):
        list(read_samples(src))
    own = tmp_path / "own.jsonl"
    own.write_text(json.dumps({"id": 1, "question": "q", "answers": ["a"], "context": "c", "evidence": [3]}) + "\n")
    with pytest.raises(DataError, match="evidence.*list of strings"):
        list(read_samples(own))


def test_training_samples_read_evidence_and_go_without():
    a, b, c = load_samples([{"question": "q", "context": "c", "answers": ["a"], "evidence": ["x y", "z"]},
                            {"question": "q", "context": "c", "answers": ["a"]},
                            {"question": "q", "context": "c", "answers": ["a"], "evidence": []}])
    assert a.evidence == ("x y", "z") and b.evidence is None and c.evidence is None
    with pytest.raises(InputError, match="'evidence' must be a list of strings"):
        load_samples([{"question": "q", "context": "c", "answers": ["a"], "evidence": {"x": 1}}])
