"""Warm-up demonstrations from gold evidence (memagent.tasks.demonstrations, `memagent data warmup`): each chunk's
ideal memory in the agent's own chunks and prompts, within M tokens, holding the evidence read so far, and the
boxed gold answer."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from memagent.agent.chunking import iter_chunks
from memagent.agent.answer import extract_boxed
from memagent.cli import app
from memagent.config import AgentConfig
from memagent.prompts import render
from memagent.rewards.step import evidence_share
from memagent.tasks.base import DataError, count_tokens
from memagent.tasks.demonstrations import NOTHING_YET, DemoStats, demonstrations, iter_demonstrations
from memagent.tasks.ruler import synthesize_ruler

FILLER = "the quiet river runs past old stone walls and green fields"  # 11 words


def _sample(tok, evidence_at: dict[int, str], chunks: int = 4, chunk_tokens: int = 40) -> dict:
    """A context of `chunks` chunks of filler (each exactly chunk_tokens tokens), with the evidence sentences placed
    in the middle of the chunks named by `evidence_at`."""
    parts = []
    for k in range(chunks):
        words = (FILLER + " ") * 10
        ids = tok(words, add_special_tokens=False)["input_ids"]
        filler = tok.decode(ids[:chunk_tokens])
        if k in evidence_at:
            cut = len(filler) // 2
            cut = filler.index(" ", cut)
            filler = filler[:cut] + " " + evidence_at[k] + filler[cut:]
        parts.append(filler)
    return {"id": "s0", "question": "What is the code of the red door?", "context": " ".join(parts),
            "answers": ["4172"], "evidence": list(evidence_at.values())}


def test_rows_hold_the_evidence_read_so_far_within_m_and_end_boxed(tokenizer):
    cfg = AgentConfig(chunk_tokens=60, memory_tokens=24)
    sample = _sample(tokenizer, {1: "The code of the red door is 4172."}, chunk_tokens=50)
    rows = demonstrations(sample, tokenizer, cfg)
    chunks = [c.text for c in iter_chunks(sample["context"], tokenizer, cfg.chunk_tokens)]
    assert [r["kind"] for r in rows] == ["memory"] * len(chunks) + ["final"]
    assert [r["step"] for r in rows] == list(range(len(chunks) + 1))
    found = next(k for k, c in enumerate(chunks) if sample["evidence"][0] in c)
    memory = cfg.empty_memory
    for k, (row, chunk) in enumerate(zip(rows, chunks)):
        # the prompt is the agent's own: the memory template over the previous memory and this chunk
        assert row["prompt"] == render(cfg.memory_template, question=sample["question"], memory=memory, chunk=chunk)
        want = sample["evidence"][0] if k >= found else NOTHING_YET
        assert row["response"] == want
        assert count_tokens(tokenizer, row["response"]) <= cfg.memory_tokens
        assert evidence_share(row["response"], sample["evidence"]) == (1.0 if k >= found else 0.0)
        memory = row["response"]
    final = rows[-1]
    assert final["prompt"] == render(cfg.final_template, question=sample["question"], memory=sample["evidence"][0])
    assert final["response"] == "\\boxed{4172}" and extract_boxed(final["response"]) == "4172"


def test_evidence_accumulates_in_document_order_and_several_answers_are_boxed_together(tokenizer):
    cfg = AgentConfig(chunk_tokens=60, memory_tokens=40)
    sample = _sample(tokenizer, {2: "VAR BB = VAR AA.", 0: "VAR AA = 31."}, chunk_tokens=50)
    sample["answers"] = ["AA", "BB"]
    rows = demonstrations(sample, tokenizer, cfg)
    memories = [r["response"] for r in rows if r["kind"] == "memory"]
    assert memories[0] == "VAR AA = 31."
    assert memories[2] == memories[-1] == "VAR AA = 31. VAR BB = VAR AA."  # the text's order, not the list's
    assert rows[-1]["response"] == "\\boxed{AA, BB}"


def test_samples_that_cannot_be_demonstrated_are_counted_not_written(tokenizer):
    m = max(count_tokens(tokenizer, NOTHING_YET), count_tokens(tokenizer, "Code 4172."))
    cfg = AgentConfig(chunk_tokens=1000, memory_tokens=m)  # one chunk: nothing is cut by a boundary
    long_ev = _sample(tokenizer, {1: "The code of the red door is 4172, and it opens at dawn."}, chunk_tokens=50)
    absent = dict(_sample(tokenizer, {}, chunk_tokens=50), id="s1", evidence=["never in the text"])
    ok = dict(_sample(tokenizer, {1: "Code 4172."}, chunk_tokens=50), id="s2")
    stats = DemoStats()
    rows = list(iter_demonstrations([long_ev, absent, ok], tokenizer, cfg, stats))
    assert {r["id"] for r in rows} == {"s2"} and stats.samples == 1
    assert stats.skipped == {f"evidence over M = {m} tokens": 1,
                             "evidence not inside one chunk (absent, or cut by a chunk boundary)": 1}
    # a needle cut by a chunk boundary: no single update could copy it whole
    text = " ".join(f"word{i}" for i in range(100))  # no stretch of it repeats
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    cut = len(tokenizer.decode(ids[:60]))
    straddle = {"id": "s3", "question": "q?", "answers": ["7"], "evidence": [text[cut - 8: cut + 8]], "context": text}
    stats = DemoStats()
    assert list(iter_demonstrations([straddle], tokenizer, AgentConfig(chunk_tokens=60, memory_tokens=40), stats)) == []
    assert sum(stats.skipped.values()) == 1
    with pytest.raises(DataError, match="cannot hold the memory"):  # M below the 'nothing yet' memory itself
        demonstrations(ok, tokenizer, AgentConfig(chunk_tokens=60, memory_tokens=2))


def test_keep_idle_drops_repeated_nothing_updates_but_the_first(tokenizer):
    cfg = AgentConfig(chunk_tokens=60, memory_tokens=24)
    sample = _sample(tokenizer, {5: "The code of the red door is 4172."}, chunks=7, chunk_tokens=50)
    every = demonstrations(sample, tokenizer, cfg)
    some = demonstrations(sample, tokenizer, cfg, keep_idle=0.0)
    idle = [r for r in every if r["response"] == NOTHING_YET]
    assert len(idle) >= 4
    assert [r for r in some if r["response"] == NOTHING_YET] == idle[:1]  # only the first update that reads nothing
    assert [r for r in some if r["response"] != NOTHING_YET] == [r for r in every if r["response"] != NOTHING_YET]


def test_real_ruler_samples_demonstrate_with_their_needles(tokenizer):
    samples = list(synthesize_ruler("niah_multikey_1", tokens=[600], samples=3, seed=0, tokenizer=tokenizer,
                                    haystack="noise", tokenizer_name="tiny"))
    samples += list(synthesize_ruler("vt", tokens=[600], samples=3, seed=0, tokenizer=tokenizer, tokenizer_name="tiny"))
    assert all(s["evidence"] for s in samples)  # vt carries its chain
    cfg = AgentConfig(chunk_tokens=200, memory_tokens=200)
    stats = DemoStats()
    rows = list(iter_demonstrations(samples, tokenizer, cfg, stats))
    assert stats.samples + sum(stats.skipped.values()) == 6 and stats.samples >= 3
    by_id = {s["id"]: s for s in samples}
    for r in rows:
        s = by_id[r["id"]]
        assert count_tokens(tokenizer, r["response"]) <= cfg.memory_tokens
        if r["kind"] == "final":
            assert all(a in extract_boxed(r["response"]) for a in s["answers"])
            assert evidence_share(r["prompt"], s["evidence"]) == 1.0  # the last memory holds all the evidence
        else:  # a distractor needle (another key) is never kept
            assert all(k not in r["response"] for k in s.get("keys", [])[1:])


def test_keep_distractors_copies_every_needle_with_its_own_key_in_document_order(tokenizer):
    cfg = AgentConfig(chunk_tokens=60, memory_tokens=60)
    blue, red = "The code of the blue door is 9310.", "The code of the red door is 4172."
    sample = _sample(tokenizer, {0: blue, 2: red}, chunk_tokens=50)
    sample["evidence"] = [red]  # the question asks for the red door; the blue one is a distractor
    sample["distractors"] = [blue, "The code of the green door is 5555."]  # the green one is not in the text
    chunks = [c.text for c in iter_chunks(sample["context"], tokenizer, cfg.chunk_tokens)]
    at_blue, at_red = (next(k for k, c in enumerate(chunks) if e in c) for e in (blue, red))
    assert at_blue < at_red
    plain = [r["response"] for r in demonstrations(sample, tokenizer, cfg) if r["kind"] == "memory"]
    kept = [r["response"] for r in demonstrations(sample, tokenizer, cfg, keep_distractors=True)
            if r["kind"] == "memory"]
    assert all("blue" not in m for m in plain)  # question-aware by default: a distractor is never written
    for k, m in enumerate(kept):
        want = [e for e, at in ((blue, at_blue), (red, at_red)) if at <= k]
        assert m == (" ".join(want) if want else NOTHING_YET)
    assert kept[-1] == f"{blue} {red}" and "green" not in kept[-1]
    assert demonstrations(sample, tokenizer, cfg, keep_distractors=True)[-1]["response"] == "\\boxed{4172}"
    tight = AgentConfig(chunk_tokens=60, memory_tokens=count_tokens(tokenizer, red))
    assert demonstrations(sample, tokenizer, tight)[-1]["response"] == "\\boxed{4172}"  # fits without the distractor
    stats = DemoStats()
    assert list(iter_demonstrations([sample], tokenizer, tight, stats, keep_distractors=True)) == []
    assert stats.skipped == {f"evidence over M = {tight.memory_tokens} tokens": 1}
    with pytest.raises(DataError, match="`distractors` must be a list of non-empty strings"):
        demonstrations({**sample, "distractors": "The code of the blue door is 9310."}, tokenizer, cfg,
                       keep_distractors=True)
    # without the flag a malformed field is never read
    assert demonstrations({**sample, "distractors": 7}, tokenizer, cfg)[-1]["response"] == "\\boxed{4172}"


def test_ruler_records_its_distractor_needles(tokenizer):
    mk, = synthesize_ruler("niah_multikey_1", tokens=[600], samples=1, seed=0, tokenizer=tokenizer,
                           haystack="noise", tokenizer_name="tiny")
    assert len(mk["distractors"]) == 3 and all(d in mk["context"] for d in mk["distractors"])
    assert [k for k in mk["keys"][1:] if not any(f"for {k} is:" in d for d in mk["distractors"])] == []
    assert not set(mk["distractors"]) & set(mk["evidence"])
    single, = synthesize_ruler("niah_single_2", tokens=[600], samples=1, seed=0, tokenizer=tokenizer,
                               haystack="noise", tokenizer_name="tiny")
    assert "distractors" not in single  # one key hidden, one asked for


def test_cli_writes_rows_and_refuses_a_file_without_evidence(tmp_path, run_cli):
    runner = CliRunner()
    data = tmp_path / "s.jsonl"
    out = tmp_path / "demos.jsonl"
    r = runner.invoke(app, ["data", "ruler", "--task", "niah_single_1", "--tokens", "400", "--samples", "3",
                            "--tokenizer", "tiny", "--out", str(data)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["data", "warmup", "--data", str(data), "--tokenizer", "tiny", "--chunk-tokens", "100",
                            "--memory-tokens", "80", "--out", str(out)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    finals = sum(x["kind"] == "final" for x in rows)
    assert finals >= 1 and f"{finals} final answers) from {finals} samples" in r.output
    assert rows and all(set(x) == {"id", "kind", "step", "prompt", "response"} for x in rows)
    bare = tmp_path / "bare.jsonl"
    bare.write_text(json.dumps({"id": "a", "question": "q?", "context": "some text", "answers": ["x"]}) + "\n")
    out2 = tmp_path / "none.jsonl"
    code, _, err = run_cli("data", "warmup", "--data", bare, "--tokenizer", "tiny", "--out", out2)
    assert code == 2 and err.startswith("error: sample 'a' has no `evidence`") and len(err.splitlines()) == 1
    assert not out2.exists()
