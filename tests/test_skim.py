"""The `skim` workflow (memagent.agent.skim): index without model calls, read only the top k chunks in document
order, answer: k + 1 calls."""
import json

import pytest

from memagent.agent.chunking import iter_chunks
from memagent.agent.registry import AgentInput, build_workflow, run_workflow
from memagent.agent.skim import MAX_K, skim
from memagent.config import AgentConfig, ConfigError

from fakes import ScriptedBackend

C = 16
TEMPLATE_MEM = "Q:{question}|M:{memory}|C:{chunk}|"
TEMPLATE_FIN = "Q:{question}|M:{memory}|A:"


def _config(**kw):
    base = dict(chunk_tokens=C, memory_tokens=16, answer_tokens=8, query_tokens=16, memory_template=TEMPLATE_MEM,
                final_template=TEMPLATE_FIN, empty_memory="none")
    return AgentConfig(**{**base, **kw})


def _doc(tok, facts: list[str], filler: int = 15) -> tuple[str, list[str], list[int]]:
    """`filler` words "fN" before each fact and after the last: the document, its chunks' texts (as the chunker
    makes them) and the chunk number of each fact (each lies whole in one chunk)."""
    words, n = [], 0
    for fact in [*facts, None]:
        words += [f"f{n + i}" for i in range(filler)]
        n += filler
        if fact is not None:
            words.append(fact)
    doc = " ".join(words)
    chunks = [c.text for c in iter_chunks(doc, tok, C)]
    where = [next(i for i, c in enumerate(chunks) if fact in c) for fact in facts]
    return doc, chunks, where


def reader(prompt, call):
    """Memory: the old memory plus the words "kN is vM" the chunk holds; answer: the value of k7 in memory."""
    if "|C:" in prompt:
        memory = prompt.split("|M:", 1)[1].split("|C:", 1)[0]
        chunk = prompt.split("|C:", 1)[1]
        found = [w for w in ("k7 is v5", "k2 is v9", "k4 is v1") if w in chunk]
        return " ".join([memory, *found]) if found else memory
    return "\\boxed{v5}" if "k7 is v5" in prompt else "\\boxed{unknown}"


def test_skim_reads_the_top_k_chunks_in_document_order_with_k_plus_1_calls(tiny_tokenizer):
    doc, chunks, where = _doc(tiny_tokenizer, ["k7 k7 k7", "k7 was seen", "k7 is v5"])
    assert where == [2, 5, 8] and len(chunks) == 12
    backend = ScriptedBackend(tiny_tokenizer, reader)
    records = []
    wf = build_workflow("skim", backend, _config(), k=3, keep_conversations=True, on_step=records.append)
    [res] = run_workflow(wf, [AgentInput("what is k7", doc, "d")])
    assert res.answer == "v5" and res.calls == 3 + 1 and wf.stats.calls == 4 and res.num_chunks == 12
    prompts = [p for b in backend.batches for p in b]
    # the three chunks that hold "k7" (BM25 ranks 2 first: three times), read in document order
    assert prompts[:3] == [f"Q:what is k7|M:none|C:{chunks[i]}|" for i in (2, 5, 8)]
    assert prompts[3] == "Q:what is k7|M:none k7 is v5|A:"
    assert [(c.kind, c.step) for c in res.conversations] == [("memory", 2), ("memory", 5), ("memory", 8),
                                                            ("final", 12)]
    assert len(records) == 4  # one trace record per model call
    assert [(r["step"], r["chunk_start"], r["chunk_tokens"]) for r in records[:3]] == [
        (2, 2 * C, C), (5, 5 * C, C), (8, 8 * C, C)]  # each chunk's offset: the evidence


def test_fewer_matches_than_k_are_filled_with_the_earliest_other_chunks(tiny_tokenizer):
    doc, chunks, [at] = _doc(tiny_tokenizer, ["k7 is v5"], filler=60)
    assert at > 3
    backend = ScriptedBackend(tiny_tokenizer, reader)
    [res] = run_workflow(build_workflow("skim", backend, _config(), keep_conversations=True),
                         [AgentInput("what is k7", doc, "d")])  # k = 4 by default
    assert [c.step for c in res.conversations] == [0, 1, 2, at, len(chunks)]
    assert res.calls == 5 and res.answer == "v5"


def test_with_k_at_least_the_chunks_skim_is_memagent(tiny_backend):
    doc = " ".join(f"w{i % 30}" for i in range(150)) + " k7 is v5 " + " ".join(f"u{i % 30}" for i in range(60))
    cfg = AgentConfig(chunk_tokens=40, memory_tokens=8, answer_tokens=6, query_tokens=16)
    item = AgentInput("what is k7?", doc, "d")
    [plain] = run_workflow(build_workflow("memagent", tiny_backend, cfg, keep_conversations=True), [item])
    [skim] = run_workflow(build_workflow("skim", tiny_backend, cfg, keep_conversations=True, k=MAX_K), [item])
    assert skim.raw_answer == plain.raw_answer and skim.memory == plain.memory
    assert [(c.kind, c.step, c.prompt_ids, c.response_ids) for c in skim.conversations] == \
        [(c.kind, c.step, c.prompt_ids, c.response_ids) for c in plain.conversations]
    assert skim.calls == plain.calls == plain.num_chunks + 1


def test_greedy_skim_on_the_tiny_model_reads_k_chunks(tiny_backend):
    doc = " ".join(f"w{i % 30}" for i in range(300)) + " k7 is v5 " + " ".join(f"u{i % 30}" for i in range(300))
    cfg = AgentConfig(chunk_tokens=32, memory_tokens=8, answer_tokens=6, query_tokens=16)
    runs = [run_workflow(build_workflow("skim", tiny_backend, cfg, keep_conversations=True, k=2),
                         [AgentInput("what is k7?", doc, "d")])[0] for _ in range(2)]
    a, b = runs
    ids = tiny_backend.tokenizer(doc, add_special_tokens=False)["input_ids"]
    k7 = next(i for i in range(0, len(ids), 32) if "k7" in tiny_backend.tokenizer.decode(ids[i:i + 32])) // 32
    assert a.calls == 3 and [c.kind for c in a.conversations] == ["memory", "memory", "final"]
    steps = [c.step for c in a.conversations[:2]]
    assert k7 in steps and steps == sorted(steps) and a.num_chunks == -(-len(ids) // 32)
    assert a.raw_answer == b.raw_answer and [c.response_ids for c in a.conversations] == \
        [c.response_ids for c in b.conversations]


def test_a_stream_is_read_once_and_its_chunks_come_from_the_index(tiny_tokenizer, tmp_path):
    doc, chunks, [at] = _doc(tiny_tokenizer, ["k7 is v5"])
    reads = []

    def blocks():  # a one-shot stream: it cannot be read twice
        for i in range(0, len(doc), 50):
            reads.append(i)
            yield doc[i:i + 50]

    backend = ScriptedBackend(tiny_tokenizer, reader)
    wf = build_workflow("skim", backend, _config(), k=1, index_dir=tmp_path, trace_path=tmp_path / "t.jsonl")
    [res] = run_workflow(wf, [AgentInput("what is k7", blocks(), "d")])
    assert res.answer == "v5" and reads == list(range(0, len(doc), 50))
    assert backend.batches[0] == [f"Q:what is k7|M:none|C:{chunks[at]}|"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]  # the index is gone
    records = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [(r.get("kind"), r.get("chunk_start")) for r in records] == [(None, C * at), ("final", None)]


def test_an_empty_document_is_answered_from_the_empty_memory(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, reader)
    [res] = run_workflow(build_workflow("skim", backend, _config(), keep_conversations=True), [AgentInput("q?", "")])
    assert [c.kind for c in res.conversations] == ["final"] and res.calls == 1 and res.num_chunks == 0


@pytest.mark.parametrize("options,message", [
    (dict(k=0), "k must be an integer from 1 to 64"), (dict(k=MAX_K + 1), "k must be"), (dict(k="many"), "k must"),
    (dict(hits=2), "workflow skim has no option hits; its options are k, index_dir, keep_index"),
])
def test_options_are_bounded_and_checked(tiny_tokenizer, options, message):
    with pytest.raises(ConfigError, match=message):
        build_workflow("skim", ScriptedBackend(tiny_tokenizer, reader), _config(), **options)
    wf = build_workflow("skim", ScriptedBackend(tiny_tokenizer, reader), _config(), k="8")
    assert wf.workflow is skim and wf.own.k == 8
