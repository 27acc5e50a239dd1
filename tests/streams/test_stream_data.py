"""`memagent data import --format longmemeval|locomo|memoryagentbench` (files written here in the released shapes)
and `memagent data streams`: streams, questions, gold and evidence; a LongMemEval file imported and scored."""
from __future__ import annotations

import json
import re

import pytest
from fakes import ScriptedBackend

from memagent.config import AgentConfig
from memagent.streams import Stream
from memagent.tasks.metrics import get_metric


def _turn(role, content, has_answer=False):
    return {"role": role, "content": content, **({"has_answer": True} if has_answer else {})}


LONGMEMEVAL = [
    {"question_id": "e47becba", "question_type": "knowledge-update", "question": "Where do I live now?",
     "answer": "Lisbon", "question_date": "2023/06/01 (Thu) 10:00",
     "haystack_session_ids": ["s1", "answer_ab12"], "haystack_dates": ["2023/05/20 (Sat) 02:21",
                                                                       "2023/05/28 (Sun) 18:05"],
     "haystack_sessions": [[_turn("user", "I live in Porto."), _turn("assistant", "Porto is lovely.")],
                           [_turn("user", "I moved to Lisbon last week.", True), _turn("assistant", "Congrats!")]],
     "answer_session_ids": ["answer_ab12"]},
    {"question_id": "gpt4_2f8_abs", "question_type": "single-session-user", "question": "What is my cat's name?",
     "answer": "You did not mention a cat.", "question_date": "2023/06/02 (Fri) 09:00",
     "haystack_session_ids": ["s9"], "haystack_dates": ["2023/05/21 (Sun) 08:00"],
     "haystack_sessions": [[_turn("user", "My dog is Rex.")]], "answer_session_ids": []},
]


def oracle(gold: dict[str, str]):
    """A scripted model that keeps in its memory any gold answer it reads, and boxes the last one kept."""
    def reply(prompt: str, _: int) -> str:
        memory = re.search(r"<memory>\s*(.*?)\s*</memory>", prompt, re.S).group(1)
        section = re.search(r"<section>\s*(.*?)\s*</section>", prompt, re.S)
        if section is None:
            found = [w for w in memory.split() if w in gold.values()]
            return f"\\boxed{{{found[-1] if found else 'unknown'}}}"
        return " ".join([w for w in memory.split() if w in gold.values()] +
                        [g for g in gold.values() if g in section.group(1)]) or "nothing"
    return reply


def test_longmemeval_file_imported_and_scored(tmp_path, run_cli, tiny_tokenizer):
    src, out = tmp_path / "longmemeval_s.json", tmp_path / "lme.jsonl"
    src.write_text(json.dumps(LONGMEMEVAL))
    code, _, err = run_cli("data", "import", src, "--format", "longmemeval", "--out", out)
    assert code == 0 and "wrote 2 streams" in err and "2 questions" in err
    samples = [json.loads(line) for line in out.read_text().splitlines()]
    ku, ab = samples
    assert (ku["id"], ku["task"], ku["ability"], ku["answers"], ku["metric"]) == (
        "e47becba", "longmemeval/knowledge-update", "knowledge-update", ["Lisbon"], "sub_em")
    assert ku["evidence"] == ["I moved to Lisbon last week."] and ku["evidence_ids"] == ["answer_ab12"]
    assert ab["abstention"] is True and ab["ability"] == "abstention" and "evidence" not in ab
    assert ku["question"].endswith("(Today is 2023/06/01 (Thu) 10:00.)")
    with Stream.open(tmp_path / ku["stream"]) as s:
        events = s.events()
        assert [(e.role, e.time, e.source) for e in events[2:]] == [
            ("user", "2023-05-28T18:05:00Z", "session answer_ab12"), ("assistant", "2023-05-28T18:05:00Z",
                                                                      "session answer_ab12")]
        assert (tmp_path / ku["document"]).read_text() == s.text()
    scores = {}
    for sample in samples:  # scored by its rule-based metric, from a standing question over its stream
        backend = ScriptedBackend(tiny_tokenizer, oracle({"a": "Lisbon", "b": "Porto"}))
        with Stream.open(tmp_path / sample["stream"]) as s:
            a = s.ask(sample["question"], backend, AgentConfig(chunk_tokens=12, memory_tokens=16), "oracle",
                      standing=True)
        scores[sample["id"]] = get_metric(sample["metric"])(a.answer, sample["answers"])
    assert scores == {"e47becba": 1.0, "gpt4_2f8_abs": 0.0}


def test_locomo_and_memoryagentbench_files(tmp_path, run_cli):
    locomo = [{"sample_id": "conv-26", "conversation": {
        "speaker_a": "Caroline", "speaker_b": "Mel Ann",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [{"speaker": "Caroline", "dia_id": "D1:1", "text": "I went to a support group yesterday."},
                      {"speaker": "Mel Ann", "dia_id": "D1:2", "text": "Look!", "blip_caption": "a sunset"}],
        "session_2_date_time": "10:37 am on 27 June, 2023",
        "session_2": [{"speaker": "Caroline", "dia_id": "D2:1", "text": "I adopted a second dog."}]},
        "qa": [{"question": "When did Caroline go to the support group?", "answer": "7 May 2023",
                "evidence": ["D1:1"], "category": 2},
               {"question": "How many dogs?", "answer": 2, "evidence": ["D2:1"], "category": 1},
               {"question": "What is Caroline's job?", "adversarial_answer": "nurse", "evidence": [], "category": 5}]}]
    (tmp_path / "locomo10.json").write_text(json.dumps(locomo))
    code, _, err = run_cli("data", "import", tmp_path / "locomo10.json", "--format", "locomo",
                           "--out", tmp_path / "lo.jsonl")
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "lo.jsonl").read_text().splitlines()]
    assert [(r["ability"], r["answers"], r["metric"]) for r in rows] == [
        ("temporal-reasoning", ["7 May 2023"], "f1"), ("multi-hop", ["2"], "f1"), ("abstention", ["not mentioned"], "f1")]
    assert rows[0]["evidence"] == ["I went to a support group yesterday."]
    with Stream.open(tmp_path / rows[0]["stream"]) as s:
        assert [(e.role, e.time, e.source) for e in s.events()] == [
            ("Caroline", "2023-05-08T13:56:00Z", "D1:1"), ("Mel_Ann", "2023-05-08T13:56:00Z", "D1:2"),
            ("Caroline", "2023-06-27T10:37:00Z", "D2:1")]
        assert s.events()[1].text == "Look! [shares a photo: a sunset]"
    mab = {"context": "Para one.\n\nPara two.\n\n" + "long " * 1000, "questions": ["q1?", "q2?"],
           "answers": [["a1", "a one"], "a2"], "metadata": {"source": "ruler_qa"}}
    (tmp_path / "mab.jsonl").write_text(json.dumps(mab) + "\n")
    assert run_cli("data", "import", tmp_path / "mab.jsonl", "--format", "memoryagentbench",
                   "--out", tmp_path / "m.jsonl")[0] == 0
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["answers"] for r in rows] == [["a1", "a one"], ["a2"]] and rows[0]["task"] == "memoryagentbench/ruler_qa"
    with Stream.open(tmp_path / rows[0]["stream"]) as s:
        texts = [e.text for e in s.events()]  # the paragraphs packed, the long one cut at 4,000 characters
        assert texts[0] == "Para one.\n\nPara two." and len(texts) == 3
        assert all(len(t) <= 4000 for t in texts) and sum(t.count("long") for t in texts) == 1000


@pytest.mark.parametrize("fmt, content, words", [
    ("longmemeval", "{not json", "is not longmemeval JSON"),
    ("longmemeval", json.dumps([{"question_id": "x"}]), "lacks the field 'haystack_sessions'"),
    ("longmemeval", json.dumps([dict(LONGMEMEVAL[0], haystack_dates=["yesterday", "today"])]), "bad date"),
    ("locomo", json.dumps({"a": 1}), "JSON array"),
    ("memoryagentbench", json.dumps([{"context": "c", "questions": ["q"], "answers": []}]), "1 questions but 0"),
])
def test_bad_benchmark_files_are_one_line(tmp_path, run_cli, fmt, content, words):
    (tmp_path / "f.json").write_text(content)
    code, _, err = run_cli("data", "import", tmp_path / "f.json", "--format", fmt, "--out", tmp_path / "o.jsonl")
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and words in err, err


def test_look_alikes_are_seeded_typed_and_carry_their_evidence(tmp_path, run_cli):
    for name in ("a", "b"):
        assert run_cli("data", "streams", "--out", tmp_path / f"{name}.jsonl", "--conversations", "3",
                       "--sessions", "6", "--seed", "4")[0] == 0
    assert (tmp_path / "a.jsonl").read_text().replace("a.streams", "b.streams") == (tmp_path / "b.jsonl").read_text()
    rows = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert {r["ability"] for r in rows} == {"information-extraction", "knowledge-update", "temporal-reasoning",
                                            "multi-session", "abstention"}
    for r in rows:
        text = (tmp_path / r["document"]).read_text()
        assert all(e in text for e in r.get("evidence", []))
        if r["ability"] == "knowledge-update":  # the last city said is the answer
            said = re.findall(r"(?:live in|moved to) (\w+)", text)
            assert said[-1] == r["answers"][0]
        if r["ability"] == "abstention":
            assert r["question"].split("user's ")[1].rstrip("?") not in text
