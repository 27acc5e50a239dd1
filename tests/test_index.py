"""The on-disk chunk index (memagent.documents.index): exact offsets, BM25 order, any query read as plain words, the
file's lifetime."""
import sqlite3
from dataclasses import replace

import pytest

from memagent.agent.chunking import Chunk, iter_chunks
from memagent.documents.index import (MAX_TERMS, ChunkIndex, ChunkIndexError, check_fts5, match_expression,
                                  query_terms)


def _facts_index(**kw) -> ChunkIndex:
    """Ten chunks "filler words kI is vI here" (I = 0..9), chunk i at token offset 3 i."""
    ix = ChunkIndex(**kw)
    for i in range(10):
        ix.add(Chunk(i, f"filler words k{i} is v{i} here", [100 + i, 200 + i, 300 + i], 3 * i))
    return ix


def test_a_term_finds_its_chunk_with_exact_offsets_and_ids(tiny_tokenizer):
    doc = " ".join(f"w{i % 40}" for i in range(200)) + " zebra " + " ".join(f"u{i % 40}" for i in range(200))
    ids = tiny_tokenizer(doc, add_special_tokens=False)["input_ids"]
    with ChunkIndex() as ix:
        chunks = list(iter_chunks(doc, tiny_tokenizer, 16))
        assert ix.add_all(iter(chunks)) == len(chunks) == len(ix)
        [hit] = ix.search("where is the zebra", 3)  # only one chunk holds "zebra"; "where", "is", "the" hold none
        want = next(c for c in chunks if "zebra" in c.text)
        assert (hit.chunk_no, hit.start_token, hit.end_token) == (want.index, 16 * want.index, 16 * want.index + 16)
        assert list(hit.token_ids) == ids[hit.start_token:hit.end_token] and hit.text == want.text
        assert hit.chunk() == want
        assert [h.chunk_no for h in ix] == list(range(len(chunks)))  # every row, in document order
        assert ix.get(want.index) == replace(hit, score=0.0)  # a row read by number has no score


def test_bm25_ranks_the_chunk_with_more_occurrences_first_and_ties_by_chunk_number():
    with ChunkIndex() as ix:
        ix.add(Chunk(0, "apple pear plum fig", [1] * 4, 0))
        ix.add(Chunk(1, "apple apple plum fig", [1] * 4, 4))  # same length, the term twice
        ix.add(Chunk(2, "apple pear plum fig", [1] * 4, 8))  # same text as chunk 0: a tie
        ix.add(Chunk(3, "kiwi pear plum fig", [1] * 4, 12))
        hits = ix.search("apple", 4)
        assert [h.chunk_no for h in hits] == [1, 0, 2]
        assert hits[0].score < hits[1].score == hits[2].score < 0  # SQLite's bm25(): lower is better
        assert [h.chunk_no for h in ix.search("apple", 4, exclude={1})] == [0, 2]
        assert [h.chunk_no for h in ix.search("apple", 1)] == [1]


HOSTILE = [
    ('"k7" OR', [7]),
    ("'; DROP TABLE chunks; --", []),
    ("'); DELETE FROM chunks_fts; --", []),
    ("", []),
    ("   \n\t ", []),
    ("x" * 10240, []),
    ("k3\x00k4", [3, 4]),
    ("\ud800k6\udfff", [6]),
    ("text:k5", [5]),
    ("chunks_fts:k5 OR text:k2", [2, 5]),
    ("NEAR(k1 k2, 0)", [1, 2]),
    ("k2*", [2]),
    ("NOT k9", [9]),
    ("k1 AND k8", [1, 8]),
    ("^k3", [3]),
    ("{text} : k4", [4]),
    ('"', []),
    ("''", []),
    ("(((", []),
    ("1=1 OR 1=1", []),
    ("k0\" OR \"1\"=\"1", [0]),
]


@pytest.mark.parametrize("query,chunks", HOSTILE, ids=[repr(q[:24]) for q, _ in HOSTILE])
def test_any_query_is_searched_as_plain_words_never_an_error(query, chunks):
    with _facts_index() as ix:
        hits = ix.search(query, 10)
        assert sorted(h.chunk_no for h in hits) == chunks
        assert len(list(ix)) == 10 and [h.chunk_no for h in ix.search("k5", 1)] == [5]  # the tables are intact


def test_a_10kb_query_of_words_is_bounded_to_its_first_distinct_terms():
    words = [f"k{i % 10}" for i in range(3)] + [f"noise{i}" for i in range(3000)] + ["k9"]
    query = " ".join(words)
    assert len(query) > 10240
    assert query_terms(query)[:3] == ["k0", "k1", "k2"] and len(query_terms(query)) == MAX_TERMS
    with _facts_index() as ix:
        assert sorted(h.chunk_no for h in ix.search(query, 10)) == [0, 1, 2]  # "k9", term 3004, is not searched


def test_match_expression_quotes_every_term_and_ors_them():
    assert match_expression('Who is "K7" OR NEAR(x*)?') == '"who" OR "is" OR "k7" OR "or" OR "near" OR "x"'
    assert match_expression("; -- ' \" ()") is None
    assert query_terms(None) == []  # not text: no words


def test_rows_are_written_as_the_chunks_stream():
    with ChunkIndex() as ix:
        def chunks():
            for i in range(5):
                assert len(ix) == i  # every chunk before this one is already a row
                assert [h.chunk_no for h in ix.search(f"t{i - 1}", 1)] == ([i - 1] if i else [])
                yield Chunk(i, f"t{i}", [i], i)
        assert ix.add_all(chunks()) == 5


def test_the_index_is_removed_on_close_unless_kept(tmp_path):
    ix = _facts_index()
    folder, path = ix.folder, ix.path
    assert path.is_file() and folder.name.startswith("memagent-index-")
    ix.close()
    ix.close()  # twice is fine
    assert not folder.exists() and ix.closed
    with pytest.raises(ValueError, match="closed"):
        ix.search("k1", 1)

    run = tmp_path / "run" / "index"
    ix = _facts_index(folder=run, name="doc 1/../x.sqlite")
    assert ix.path.parent == run and ix.path.name == "doc_1_.._x.sqlite"
    ix.close()
    assert run.is_dir() and list(run.iterdir()) == []  # the run's folder stays, the file goes

    ix = _facts_index(folder=run, name="kept.sqlite", keep=True)
    ix.close()
    con = sqlite3.connect(run / "kept.sqlite")
    assert con.execute("SELECT count(*), sum(end_token - start_token) FROM chunks").fetchone() == (10, 30)
    con.close()
    with ChunkIndex(run, name="kept.sqlite") as again:  # a file of the same name is replaced
        assert len(list(again)) == 0


def test_no_fts5_is_a_clear_error(monkeypatch):
    class NoFts5:
        def execute(self, sql):
            raise sqlite3.OperationalError("no such module: fts5")

        def close(self):
            pass

    monkeypatch.setattr("memagent.documents.index.sqlite3.connect", lambda *a, **k: NoFts5())
    with pytest.raises(ChunkIndexError, match=r"has no FTS5 .*no such module: fts5.*--workflow memagent"):
        check_fts5()
    with pytest.raises(ChunkIndexError):
        ChunkIndex()


def test_k_must_be_positive():
    with _facts_index() as ix:
        for k in (0, -1, True, 1.5):
            with pytest.raises(ValueError, match="positive integer"):
                ix.search("k1", k)
