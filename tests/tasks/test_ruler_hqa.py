"""RULER-HotpotQA synthesis: determinism, gold paragraphs, exact counts, token targets, lazy streams."""
from __future__ import annotations

import json
import re
import tracemalloc

import pytest
from qa_fixtures import make_hotpot

from memagent.agent.chunking import iter_chunks
from memagent.tasks.corpora import load_hotpotqa
from memagent.tasks.documents import render_documents
from memagent.tasks.ruler_hqa import select_entries, synthesize_ruler_hqa
from memagent.tasks.schema import DataError, ParagraphCache, count_tokens, read_samples, sample_document, write_samples

HEADER = re.compile(r"^Document (\d+):$", re.M)


def test_load_hotpotqa_builds_sorted_distinct_paragraphs(hotpot_file):
    corpus = load_hotpotqa(hotpot_file)
    assert len(corpus.entries) == 60 and len(corpus.paragraphs) == 600
    assert corpus.paragraphs == sorted(corpus.paragraphs)
    e = corpus.entries[7]
    assert e.source_id == "q00007" and len(e.gold) == 2 and len(e.extra) == 8
    assert corpus.paragraphs[e.gold[1]].startswith("Topic 7-1\nThe key of item 7 is ")
    assert e.answers[0] in corpus.paragraphs[e.gold[1]]


def test_same_seed_byte_identical_and_seed_matters(hotpot_file, tmp_path):
    corpus = load_hotpotqa(hotpot_file)
    paths = []
    for run, seed in enumerate((3, 3, 4)):
        paths.append(tmp_path / f"run{run}.jsonl")
        write_samples(synthesize_ruler_hqa(corpus, samples=5, seed=seed, num_docs=[20, 50]), paths[-1])
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert paths[0].read_bytes() != paths[2].read_bytes()
    assert len(list(read_samples(paths[0]))) == 10


@pytest.mark.parametrize("num_docs", [2, 5, 10, 37, 200])
def test_document_counts_exact_and_gold_present(hotpot_file, num_docs):
    corpus = load_hotpotqa(hotpot_file)
    for s in synthesize_ruler_hqa(corpus, samples=6, seed=0, num_docs=[num_docs]):
        numbers = [int(n) for n in HEADER.findall(s["context"])]
        assert numbers == list(range(1, num_docs + 1)) and s["num_docs"] == num_docs
        entry = next(e for e in corpus.entries if e.source_id == s["source_id"])
        assert len(s["gold_docs"]) == 2
        for pid in entry.gold:  # each gold paragraph is a whole document at a recorded position
            block = [p for p in s["gold_docs"] if f"Document {p}:\n{corpus.paragraphs[pid]}" in s["context"]]
            assert len(block) == 1
        assert s["answers"] == entry.answers and s["metric"] == "sub_em"
        if num_docs >= 10:  # all of the question's own distractors are kept
            for pid in entry.extra:
                assert corpus.paragraphs[pid] in s["context"]


def test_same_questions_at_every_length(hotpot_file):
    corpus = load_hotpotqa(hotpot_file)
    out = list(synthesize_ruler_hqa(corpus, samples=4, seed=1, num_docs=[10, 40]))
    assert [s["source_id"] for s in out[:4]] == [s["source_id"] for s in out[4:]]
    assert [s["id"] for s in out[:2]] == ["ruler_hqa-docs10-0000", "ruler_hqa-docs10-0001"]


@pytest.mark.parametrize("target", [1500, 3000, 6000])  # >= 25 paragraphs: 2% is reachable
def test_token_targets_within_two_percent(hotpot_file, tokenizer, target):
    corpus = load_hotpotqa(hotpot_file)
    for s in synthesize_ruler_hqa(corpus, samples=3, seed=2, tokens=[target], tokenizer=tokenizer, tokenizer_name="bpe"):
        measured = count_tokens(tokenizer, s["context"])
        assert measured == s["num_tokens"] and s["tokens_exact"]
        assert abs(measured - target) <= 0.02 * target, (measured, target)
        assert s["length"] == target and s["length_unit"] == "tokens" and s["tokenizer"] == "bpe"
        assert len(HEADER.findall(s["context"])) == s["num_docs"]


def test_lazy_expansion_equals_eager_text(hotpot_file, tokenizer):
    corpus = load_hotpotqa(hotpot_file)
    eager = list(synthesize_ruler_hqa(corpus, samples=2, seed=5, num_docs=[30], tokenizer=tokenizer))
    lazy = list(synthesize_ruler_hqa(corpus, samples=2, seed=5, num_docs=[30], tokenizer=tokenizer, lazy_threshold=30))
    for e, z in zip(eager, lazy):
        assert "context" not in z and z["lazy"]["sha256"] == corpus.sha256
        blocks = list(sample_document(z))
        assert len(blocks) == 30 and "".join(blocks) == e["context"]
        # the workflow's chunker cuts the stream exactly where it cuts the whole text
        streamed = [c.token_ids for c in iter_chunks(sample_document(z), tokenizer, 50)]
        assert streamed == [c.token_ids for c in iter_chunks(e["context"], tokenizer, 50)]
        # block-wise token count is close to the exact joint count
        assert abs(z["num_tokens"] - e["num_tokens"]) <= 0.02 * e["num_tokens"]


def test_lazy_25600_documents_stream_with_bounded_memory(hotpot_large_file, tmp_path):
    corpus = load_hotpotqa(hotpot_large_file)
    out = tmp_path / "long.jsonl"
    write_samples(synthesize_ruler_hqa(corpus, samples=1, seed=0, num_docs=[25600]), out)
    (sample,) = read_samples(out)
    assert "context" not in sample and len(sample["lazy"]["doc_ids"]) == 25600
    assert out.stat().st_size < 400_000  # indices, not text
    cache = ParagraphCache()
    stream = sample_document(sample, cache)  # loads the paragraph table (the source), not the text
    tracemalloc.start()
    n_blocks = n_chars = 0
    golds_seen = 0
    gold_set = set(sample["gold_docs"])
    for i, block in enumerate(stream, 1):
        n_blocks += 1
        n_chars += len(block)
        golds_seen += i in gold_set
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert n_blocks == 25600 and golds_seen == 2
    assert n_chars > 1_500_000  # the whole text would be megabytes ...
    assert peak < 100_000, peak  # ... the stream never holds more than a few blocks


def test_lazy_source_changed_is_an_error(hotpot_file, tmp_path):
    src = tmp_path / "h.json"
    src.write_bytes(hotpot_file.read_bytes())
    (s,) = synthesize_ruler_hqa(load_hotpotqa(src), samples=1, seed=0, num_docs=[15], lazy_threshold=10)
    src.write_text(json.dumps(make_hotpot(61)))
    with pytest.raises(DataError, match="changed since the samples were written"):
        sample_document(s)


def test_malformed_entry_is_named(tmp_path):
    data = make_hotpot(5)
    del data[3]["context"]
    src = tmp_path / "bad.json"
    src.write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"entry #3 \(id q00003\).*no 'context'"):
        load_hotpotqa(src)
    data = make_hotpot(5)
    data[2]["context"][0] = ["title only"]
    src.write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"entry #2 .*not \[title, \[sentences\]\]"):
        load_hotpotqa(src)
    data = make_hotpot(5)
    data[1]["supporting_facts"] = [["Nowhere", 0]]
    src.write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"entry #1 .*'Nowhere'"):
        load_hotpotqa(src)
    src.write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        load_hotpotqa(src)


def test_bad_lengths_are_errors(hotpot_file, tokenizer):
    corpus = load_hotpotqa(hotpot_file)
    with pytest.raises(DataError, match=r"entry #\d+ \(id q\d+\): 1 documents cannot hold its 2 gold"):
        list(synthesize_ruler_hqa(corpus, samples=1, seed=0, num_docs=[1]))
    with pytest.raises(DataError, match="source has only 590"):
        list(synthesize_ruler_hqa(corpus, samples=1, seed=0, num_docs=[601]))
    with pytest.raises(DataError, match="gold paragraphs alone take"):
        list(synthesize_ruler_hqa(corpus, samples=1, seed=0, tokens=[5], tokenizer=tokenizer))
    with pytest.raises(DataError, match="exactly one of"):
        list(synthesize_ruler_hqa(corpus, samples=1, seed=0))
    with pytest.raises(DataError, match="need a tokenizer"):
        list(synthesize_ruler_hqa(corpus, samples=1, seed=0, tokens=[100]))
    with pytest.raises(DataError, match="holds only 60 questions"):
        list(synthesize_ruler_hqa(corpus, samples=61, seed=0, num_docs=[10]))


def test_no_context_filter_drops_answered_questions(hotpot_file):
    corpus = load_hotpotqa(hotpot_file)
    asked = []

    def answered(batch):  # pretend the model knows every question with an even index
        asked.append(len(batch))
        return [e.index % 2 == 0 for e in batch]

    picked = select_entries(corpus, 10, seed=0, answered_without_context=answered, batch_size=8)
    assert len(picked) == 10 and all(e.index % 2 == 1 for e in picked)
    assert sum(asked) < 60  # asked in batches, only until enough survive
    unfiltered = [e for e in select_entries(corpus, 60, seed=0) if e.index % 2 == 1]
    assert picked == unfiltered[:10]  # same seeded order
    with pytest.raises(DataError, match="only 30 of 60 questions"):
        select_entries(corpus, 31, seed=0, answered_without_context=answered)


def test_render_documents_format():
    assert render_documents(["T\nx", "U\ny"]) == "Document 1:\nT\nx\n\nDocument 2:\nU\ny"


def test_closed_book_filter_with_a_scripted_backend(hotpot_file):
    from memagent.backends.base import Generation
    from memagent.tasks.ruler_hqa import closed_book_filter

    corpus = load_hotpotqa(hotpot_file)

    class Scripted:  # knows the answer of question 0 only, boxed; answers 1 unboxed; fails the rest
        tokenizer, max_window = None, None
        prompts: list[str] = []

        def generate(self, prompts, params):
            self.prompts.extend(prompts)
            out = []
            for p in prompts:
                if "item 0 " in p:
                    out.append(Generation(text=f"\\boxed{{{corpus.entries[0].answers[0]}}}"))
                elif "item 1 " in p:
                    out.append(Generation(text=f"It is {corpus.entries[1].answers[0]}."))
                else:
                    out.append(Generation(text="\\boxed{no idea}"))
            return out

    backend = Scripted()
    verdicts = closed_book_filter(backend)(corpus.entries[:4])
    assert verdicts == [True, True, False, False]
    assert "Question: What is the key of item 2" in backend.prompts[2] and "Document" not in backend.prompts[2]
