"""memagent.timeline: word diff, rows, cut flag and evidence steps, on hand-worked memories."""
from __future__ import annotations

import pytest

from memagent.errors import InputError
from memagent.timeline import evidence_steps, group_by_doc, timeline_rows, word_diff, word_sources


def _mem(step, memory, doc="d", truncated=False, **extra):
    return dict(doc_id=doc, step=step, chunk_start=100 * step, chunk_tokens=100, memory=memory,
                truncated=truncated, **extra)


def test_word_diff_runs():
    # old: a b c d e ; new: a X c d Y Z e  -> b replaced by X; Y Z inserted before e
    added, removed = word_diff("a b c d e", "a X c d Y Z e")
    assert added == ["X", "Y Z"]
    assert removed == ["b"]


def test_word_diff_whitespace_only_and_empty():
    assert word_diff("a  b\nc", "a b c") == ([], [])
    assert word_diff("", "one two") == (["one two"], [])
    assert word_diff("one two", "") == ([], ["one two"])


def test_word_diff_repeated_words_prefix_suffix():
    # common prefix "x x" and suffix "x": only the middle "y" -> "z z" differs
    assert word_diff("x x y x", "x x z z x") == (["z z"], ["y"])


def test_rows_in_step_order_with_cut_flag_and_chunk_text():
    records = [
        _mem(1, "alpha beta gamma", truncated=True),
        _mem(0, "alpha beta", chunk_text="chunk zero"),
        dict(doc_id="d", step=2, kind="final", answer="beta", raw_answer="\\boxed{beta}"),
    ]
    rows = timeline_rows(records)
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[0]["previous_memory"] == "" and rows[0]["added"] == ["alpha beta"] and rows[0]["removed"] == []
    assert rows[0]["chunk_text"] == "chunk zero" and rows[0]["truncated"] is False
    assert rows[1]["previous_memory"] == "alpha beta"
    assert rows[1]["added"] == ["gamma"] and rows[1]["removed"] == []
    assert rows[1]["truncated"] is True and rows[1]["chunk_text"] is None
    assert rows[1]["chunk_start"] == 100 and rows[1]["chunk_tokens"] == 100
    assert all(r["changed"] for r in rows)


def test_unchanged_row_and_empty_memory_text():
    rows = timeline_rows([_mem(0, "No previous memory"), _mem(1, "No  previous memory")],
                         empty_memory="No previous memory")
    assert [r["changed"] for r in rows] == [False, False]
    assert rows[0]["added"] == [] and rows[1]["added"] == []


def test_evidence_steps_hand_worked():
    # step 0 writes "k1 v1 filler"; step 1 drops filler, adds "k2 v2"; step 2 changes nothing;
    # step 3 replaces "v1" by "v9" and adds "junk"; step 4 removes "junk".
    # Final "k1 v9 k2 v2": k1 <- 0, v9 <- 3, k2 v2 <- 1  => evidence [0, 1, 3]; 2 and 4 added nothing that survives.
    records = [_mem(0, "k1 v1 filler"), _mem(1, "k1 v1 k2 v2"), _mem(2, "k1 v1 k2 v2"),
               _mem(3, "k1 v9 k2 v2 junk"), _mem(4, "k1 v9 k2 v2")]
    assert word_sources(records) == [("k1", 0), ("v9", 3), ("k2", 1), ("v2", 1)]
    assert evidence_steps(records) == [0, 1, 3]


def test_evidence_rewritten_words_take_the_later_step():
    # "fact" removed at step 1 and written again at step 2: step 2 is its source, step 0 left nothing
    records = [_mem(0, "fact"), _mem(1, "other"), _mem(2, "other fact")]
    assert evidence_steps(records) == [1, 2]


def test_evidence_empty_memory_words_are_no_step():
    assert evidence_steps([_mem(0, "empty memory")], empty_memory="empty memory") == []
    assert evidence_steps([_mem(0, "")]) == []
    assert evidence_steps([]) == []


def test_group_by_doc_and_one_doc_only():
    records = [_mem(0, "a", doc="x"), _mem(0, "b", doc="y"), _mem(1, "c", doc="x")]
    groups = group_by_doc(records)
    assert list(groups) == ["x", "y"] and [r["memory"] for r in groups["x"]] == ["a", "c"]
    with pytest.raises(InputError, match="one document"):
        timeline_rows(records)


def test_record_without_memory_is_an_input_error():
    with pytest.raises(InputError, match="'memory'"):
        timeline_rows([dict(doc_id="d", step=0)])
