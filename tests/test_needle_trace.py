"""bench/needle_trace.py's counts on a hand-made document, trace and answers: which needle numbers entered the memory,
whether each was kept with its own key, and why an answer was wrong."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from memagent.agent.chunking import iter_chunks

SPEC = importlib.util.spec_from_file_location("needle_trace", Path(__file__).resolve().parents[1] / "bench" /
                                              "needle_trace.py")
needle_trace = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(needle_trace)

FILLER = "the quiet river runs past old stone walls and green fields. " * 5


def needle(key: str, value: str) -> str:
    return f"One of the special magic numbers for {key} is: {value}."


def test_a_relabelled_distractor_and_a_wrong_pick_are_told_apart(tokenizer):
    context = " ".join([FILLER, needle("red-door", "111"), FILLER, needle("blue-door", "222"),
                        needle("green-door", "333"), FILLER])
    chunks = [c.text for c in iter_chunks(context, tokenizer, 150)]
    where = [[k for k, c in enumerate(chunks) if needle(key, v) in c]
             for key, v in (("red-door", "111"), ("blue-door", "222"), ("green-door", "333"))]
    assert all(len(w) == 1 for w in where)  # each needle whole inside one chunk
    where = [w[0] for w in where]
    assert where[0] < where[1] == where[2] == len(chunks) - 2  # the second chunk with needles holds two
    samples = {"a": {"id": "a", "context": context, "answers": ["222"]},  # asks for blue-door
               "b": {"id": "b", "context": context, "answers": ["222"]}}
    memories = {  # a: relabels red's number under the question's key and never keeps 222
        "a": [needle("blue-door", "111") if k >= where[0] else "nothing" for k in range(len(chunks))],
        # b: keeps red, then adds blue but not green (one of two new needles), then answers red's number
        "b": [(needle("red-door", "111") if k >= where[0] else "nothing")
              + (" " + needle("blue-door", "222") if k >= where[1] else "") for k in range(len(chunks))]}
    trace = [{"doc_id": d, "step": k, "memory": m} for d, ms in memories.items() for k, m in enumerate(ms)]
    trace += [{"doc_id": d, "kind": "final"} for d in memories]
    answers = {"a": {"id": "a", "answer": "111"}, "b": {"id": "b", "answer": "111"}}
    out = needle_trace.analyse(samples, trace, answers, tokenizer, 150)
    # a reads 111 (added), then 222 and 333 (neither added); b reads 111 (added), then 222 and 333 (222 added)
    assert (out["needles_read"], out["needles_added"]) == (6, 3)
    assert out["pairs"] == {"held": 3, "own_key": 2}  # a's one pair is relabelled
    assert out["updates"] == {"0 in memory, 1 new": 2, "0 in memory, 1 new: added": 2,
                              "1 in memory, 2 new": 2, "1 in memory, 2 new: added": 1}
    assert out["outcomes"] == {"the queried needle never in the memory": 1,
                               "the queried needle in the last memory, picked an earlier needle": 1,
                               "last memory holds 1 of 3 needles": 1, "last memory holds 2 of 3 needles": 1}


def test_stray_writes_in_idle_updates_and_needles_lost_in_copies(tokenizer):
    nothing = needle_trace.NOTHING_YET
    context = " ".join([FILLER * 2, needle("red-door", "111"), FILLER * 2])
    chunks = [c.text for c in iter_chunks(context, tokenizer, 100)]
    at = [k for k, c in enumerate(chunks) if needle("red-door", "111") in c]
    assert len(at) == 1 and 2 <= at[0] <= len(chunks) - 3  # two idle chunks before it, two or more after
    at, n = at[0], len(chunks)
    samples = {d: {"id": d, "context": context, "answers": ["111"]} for d in "abc"}
    held = needle("red-door", "111")
    memories = {
        "a": [nothing] * at + [held] * (n - at),  # the demonstrated policy: no stray write, nothing lost
        # b: a stray sentence at its second idle update, copied to the end: never writes the needle
        "b": [nothing, "One thing relevant to the problem yet."] + ["One thing relevant to the problem yet."] * (n - 2),
        # c: writes the needle, then drops it at the last update (a copy that lost it)
        "c": [nothing] * at + [held] * (n - at - 1) + [nothing]}
    trace = [{"doc_id": d, "step": k, "memory": m + " "} for d, ms in memories.items() for k, m in enumerate(ms)]
    answers = {"a": {"id": "a", "answer": "111"}, "b": {"id": "b", "answer": "red-door"},
               "c": {"id": "c", "answer": "none"}}
    out = needle_trace.analyse(samples, trace, answers, tokenizer, 100)
    # idle updates: a and c at every chunk before the needle (at each); b at steps 0 and 1 only (then it strayed)
    assert out["idle"] == {"updates": 2 * at + 2, "stray_writes": 1, "strayed_documents": 1,
                           "strayed_documents_right": 0}
    # copies: a and c after the needle (n - at - 1 each); c's last one lost 111. c's last update is a copy, not idle:
    # the memory before it held the needle
    assert out["copies"] == {"updates": 2 * (n - at - 1), "needle_lost": 1}
    assert out["outcomes"]["right"] == 1
    assert out["outcomes"]["the queried needle never in the memory"] == 1
    assert out["outcomes"]["the queried needle kept, then dropped"] == 1
