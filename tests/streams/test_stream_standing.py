"""The key property of a standing question: after any sequence of appends, its memories and answer are those of
`memagent ask` over the stream's text with the same chunking (tests/streams/stream_helpers.ask_reference)."""
from __future__ import annotations

import random

import pytest
from stream_helpers import ask_reference, gpt2_style_tokenizer, random_events, scripted_backend

from memagent.agent.chunking import iter_chunks
from memagent.config import AgentConfig
from memagent.streams import Stream, StreamError
from memagent.streams.standing import token_ids

QUESTION = "Where does the user live now?"


def _check_equal(stream: Stream, backend, config: AgentConfig, model: str = "m") -> None:
    """The standing question's kept memories, and an answer asked now, against `ask` over the text so far."""
    q = stream.standing(QUESTION, backend, config, model)
    got = q.answer()
    records, ref = ask_reference(backend, config, stream.text(), QUESTION)
    versions = q.memories()
    full = len(versions)
    assert [v["memory"] for v in versions] == [r["memory"] for r in records[:full]]
    assert [v["record"]["chunk_start"] for v in versions] == [r["chunk_start"] for r in records[:full]]
    assert len(records) - full in (0, 1)  # at most the tail is left: read when asked
    assert (got.answer, got.raw_answer, got.memory, got.chunks) == (ref.answer, ref.raw_answer, ref.memory,
                                                                  ref.num_chunks)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_standing_question_equals_ask_after_any_appends(tmp_path, tiny_tokenizer, seed):
    rng = random.Random(seed)
    backend = scripted_backend(tiny_tokenizer)
    config = AgentConfig(chunk_tokens=rng.choice([7, 16, 33]), memory_tokens=12, answer_tokens=16)
    with Stream.create(tmp_path / "s.db") as s:
        s.standing(QUESTION, backend, config, "m")  # registered before any event
        events = random_events(rng, 40)
        i = 0
        while i < len(events):
            n = rng.randint(1, 6)
            for e in events[i:i + n]:
                s.append(**e)
            i += n
            if rng.random() < 0.5:
                s.standing(QUESTION, backend, config, "m").advance()  # a watcher between appends, sometimes
            if rng.random() < 0.3:
                _check_equal(s, backend, config)
        _check_equal(s, backend, config)
        assert len(s.memories(1)) >= 10  # every version kept


def test_answer_is_two_calls_once_current_and_versions_are_kept(tmp_path, tiny_tokenizer):
    backend = scripted_backend(tiny_tokenizer)
    config = AgentConfig(chunk_tokens=10, memory_tokens=12, answer_tokens=16)
    with Stream.create(tmp_path / "s.db") as s:
        for e in random_events(random.Random(5), 30):
            s.append(**e)
        q = s.standing(QUESTION, backend, config, "m")
        made = q.advance()
        total = len(token_ids(tiny_tokenizer, s.text()))
        assert [v.chunk for v in made] == list(range(total // 10))
        before = len(backend.batches)
        a = q.answer()
        assert len(backend.batches) - before == a.calls == (2 if total % 10 else 1)
        assert q.advance() == []  # nothing new: no call
        assert len(q.memories()) == total // 10
        assert s.answers(q.id)[-1]["answer"] == a.answer


def test_sampled_seeds_are_those_of_ask(tmp_path, tiny_tokenizer):
    """With sampling, each call of the stream gets the seed `ask` gives the same call of the whole text."""
    config = AgentConfig(chunk_tokens=9, memory_tokens=12, answer_tokens=16, temperature=1.0, seed=7)
    backend = scripted_backend(tiny_tokenizer)
    with Stream.create(tmp_path / "s.db") as s:
        for e in random_events(random.Random(3), 12):
            s.append(**e)
            s.standing(QUESTION, backend, config, "m").advance()
        s.standing(QUESTION, backend, config, "m").answer()
        stream_seeds = [p.seed for p in backend.params]
        ref = scripted_backend(tiny_tokenizer)
        ask_reference(ref, config, s.text(), QUESTION)
    assert stream_seeds == [p.seed for p in ref.params]
    assert len(set(stream_seeds)) == len(stream_seeds)


@pytest.mark.parametrize("kind", ["qwen", "gpt2"])
def test_event_tokens_are_the_whole_texts_chunks(tmp_path, tiny_tokenizer, kind):
    """Each event tokenised alone, concatenated, is the whole text's ids as iter_chunks cuts them (text over
    iter_chunks' 64K-character block included), for both pre-tokeniser families."""
    tok = tiny_tokenizer if kind == "qwen" else gpt2_style_tokenizer()
    rng = random.Random(11)
    with Stream.create(tmp_path / "s.db") as s:
        s.append_many(random_events(rng, 900))
        ids = [i for e in s.events() for i in token_ids(tok, e.render())]
        text = s.text()
    assert len(text) > 70_000
    assert [i for c in iter_chunks(text, tok, 50) for i in c.token_ids] == ids


def test_standing_equals_ask_on_the_tiny_model(tmp_path, tiny_backend):
    """The real (tiny, greedy) model: the same memories and answer as ask over the text."""
    config = AgentConfig(chunk_tokens=24, memory_tokens=8, answer_tokens=8, query_tokens=16)
    with Stream.create(tmp_path / "s.db") as s:
        for e in random_events(random.Random(2), 8):
            s.append(**e)
            s.standing(QUESTION, tiny_backend, config, "tiny").advance()
        _check_equal(s, tiny_backend, config, "tiny")


class _JoiningTokenizer:
    """A character tokenizer that makes "\\n[" one token: it joins tokens across an event boundary."""

    def __call__(self, text, add_special_tokens=False):
        if isinstance(text, list):
            return {"input_ids": [self(t)["input_ids"] for t in text]}
        ids, i = [], 0
        while i < len(text):
            if text.startswith("\n[", i):
                ids.append(1 << 20)
                i += 2
            else:
                ids.append(ord(text[i]))
                i += 1
        return {"input_ids": ids}

    def decode(self, ids):
        return "".join("\n[" if i == 1 << 20 else chr(i) for i in ids)


def test_a_tokenizer_that_joins_across_events_is_refused(tmp_path):
    backend = scripted_backend(_JoiningTokenizer())
    with Stream.create(tmp_path / "s.db") as s:
        s.append("one")
        s.append("two")
        with pytest.raises(StreamError, match="joins tokens across the boundary"):
            s.standing(QUESTION, backend, AgentConfig(chunk_tokens=500, memory_tokens=4), "j").advance()


def test_a_question_over_its_budget_is_not_registered(tmp_path, tiny_tokenizer):
    from memagent.agent.protocol import BudgetError

    backend = scripted_backend(tiny_tokenizer)
    with Stream.create(tmp_path / "s.db") as s:
        with pytest.raises(BudgetError, match="over its budget of 4"):
            s.standing("a question of many more than four tokens?", backend, AgentConfig(query_tokens=4), "m")
        assert s.questions() == []


def test_watch_follows_events_appended_by_another_writer(tmp_path, tiny_tokenizer):
    import threading
    import time

    backend, config = scripted_backend(tiny_tokenizer), AgentConfig(chunk_tokens=8, memory_tokens=12)
    with Stream.create(tmp_path / "s.db") as w:
        w.append("the first event of the stream")

    def later():
        time.sleep(0.3)
        with Stream.open(tmp_path / "s.db") as w:
            for e in random_events(random.Random(9), 6):
                w.append(**e)

    writer = threading.Thread(target=later)
    writer.start()
    got = []
    with Stream.open(tmp_path / "s.db") as s:
        for v in s.watch(QUESTION, backend, config, "m", follow=True, poll=0.05,
                         stop=lambda: len(got) >= 20 or not writer.is_alive()):
            got.append(v)
        writer.join()
        first = len(token_ids(tiny_tokenizer, s.events(limit=1)[0].render())) // 8
        followed = len(got)
        total = len(token_ids(tiny_tokenizer, s.text())) // 8
        got += s.standing(QUESTION, backend, config, "m").advance()  # what arrived after its last look
    assert followed > first + 2  # versions of events appended while it waited
    assert [v.chunk for v in got] == list(range(total)) and total > 20


def test_trace_shows_each_answer_from_the_versions_it_read(tmp_path, tiny_tokenizer):
    backend, config = scripted_backend(tiny_tokenizer), AgentConfig(chunk_tokens=10, memory_tokens=12)
    with Stream.create(tmp_path / "s.db") as s:
        q = s.standing(QUESTION, backend, config, "m")
        for e in random_events(random.Random(1), 4):
            s.append(**e)
        first = q.answer()
        for e in random_events(random.Random(2), 4):
            s.append(**e)
        second = q.answer()
        trace = s.trace(q.id)
    docs = {}
    for r in trace:
        docs.setdefault(r["doc_id"], []).append(r)
    assert list(docs) == [f"q1 after event {first.events}", f"q1 after event {second.events}"]
    for a, recs in zip((first, second), docs.values()):
        assert recs[-1]["kind"] == "final" and recs[-1]["answer"] == a.answer
        assert [r["step"] for r in recs[:-1]] == list(range(a.chunks - (1 if a.calls == 2 else 0)))
