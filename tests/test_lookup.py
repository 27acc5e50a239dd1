"""The `lookup` workflow (memagent.agent.lookup): read and index, a query of the model's, hits read as memory
updates, then the answer; hand-made two-hop documents where overwrite must fail and lookup must not."""
import json
import re
from dataclasses import replace

import pytest

from memagent.agent.lookup import MAX_HITS, MAX_LOOKUPS, lookup
from memagent.agent.protocol import template_overhead
from memagent.prompts import LOOKUP_QUERY_TEMPLATE, render
from memagent.agent.registry import AgentInput, BudgetError, build_workflow, run_workflow
from memagent.backends.base import BackendError
from memagent.config import AgentConfig, ConfigError

from fakes import ScriptedBackend

C = 20  # chunk tokens
TEMPLATE_MEM = "Q:{question}|M:{memory}|C:{chunk}|"
TEMPLATE_FIN = "Q:{question}|M:{memory}|A:"
FACT = re.compile(r"k\d+ (?:is v\d+|points to k\d+)")


def _config(**kw):
    base = dict(chunk_tokens=C, memory_tokens=32, answer_tokens=8, query_tokens=16, memory_template=TEMPLATE_MEM,
                final_template=TEMPLATE_FIN, empty_memory="none")
    return AgentConfig(**{**base, **kw})


def _two_hop(tok, value_first: bool = True) -> tuple[str, list[int]]:
    """Filler with the value fact "k7 is v5" and the pointer fact "k3 points to k7", value first or last; the
    document and its token ids."""
    parts = [" ".join(f"w{i}" for i in range(40)), "k7 is v5", " ".join(f"x{i}" for i in range(40)),
             "k3 points to k7", " ".join(f"y{i}" for i in range(40))]
    if not value_first:
        parts[1], parts[3] = parts[3], parts[1]
    doc = " ".join(parts)
    return doc, tok(doc, add_special_tokens=False)["input_ids"]


def one_fact_reader(prompt: str, call: int, query: str | None = None) -> str:
    """A scripted model whose memory holds one chain of facts. It keeps a fact only when it can see that it
    matters: the pointer fact of the question's key k3, or the value of the key its memory points to; a value
    read before its pointer is dropped (it cannot know to keep it). Its query is its memory (or `query`); its
    answer is the value its chain ends in, else "unknown"."""
    if prompt.startswith("Q:") and "|C:" in prompt:
        memory = prompt.split("|M:", 1)[1].split("|C:", 1)[0]
        for fact in FACT.findall(prompt.split("|C:", 1)[1]):
            pointed = re.fullmatch(r"k3 points to (k\d+)", memory)
            if " is v" in memory:
                break  # the answer is known
            if fact.startswith("k3 points to"):
                memory = fact
            elif pointed and fact.startswith(pointed.group(1) + " is "):
                memory = f"{memory}; {fact}"
        return memory
    if "Search query:" in prompt:
        if query is not None:
            return query
        if "<memory>\n" in prompt:  # the built-in template
            return prompt.split("<memory>\n", 1)[1].split("\n</memory>", 1)[0]
        return prompt.split("M:", 1)[1].split("|", 1)[0]  # test_a_query_template_of_ones_own_...
    m = re.search(r"\|M:k3 points to (k\d+); \1 is (v\d+)\|", prompt)
    return f"\\boxed{{{m.group(2) if m else 'unknown'}}}"


class AnyTextBackend(ScriptedBackend):
    """ScriptedBackend whose replies may hold what no tokenizer takes (a lone surrogate, as JSON "\\ud800" decodes
    to): the ids are of the reply made UTF-8 clean, the text is the reply as written."""

    def generate(self, prompts, params):
        reply = self.reply
        self.reply = lambda p, c: reply(p, c).encode("utf-8", "replace").decode("utf-8")
        try:
            gens = super().generate(prompts, params)
        finally:
            self.reply = reply
        return [replace(g, text=reply(p, len(self.batches) - 1)) for g, p in zip(gens, prompts)]


def _run(tok, doc, name="lookup", reply=one_fact_reader, config=None, **options):
    backend = AnyTextBackend(tok, reply)
    records = []
    wf = build_workflow(name, backend, config or _config(), keep_conversations=True, on_step=records.append,
                        **options)
    [res] = run_workflow(wf, [AgentInput("what does k3 point to? give its value", doc, "d")])
    return res, records, backend


def test_lookup_reads_back_the_value_fact_that_overwrite_lost(tiny_tokenizer):
    doc, ids = _two_hop(tiny_tokenizer, value_first=True)
    k = -(-len(ids) // C)
    plain, _, _ = _run(tiny_tokenizer, doc, "memagent")
    assert plain.answer == "unknown"  # the memory was overwritten by the pointer fact: v5 is gone

    res, records, backend = _run(tiny_tokenizer, doc, hits=2)
    assert res.answer == "v5" and res.num_chunks == k and res.calls == k + 1 + 2 + 1
    value_chunk = next(i for i in range(k) if "k7 is v5" in tiny_tokenizer.decode(ids[C * i:C * i + C]))
    pointer_chunk = next(i for i in range(k) if "points to" in tiny_tokenizer.decode(ids[C * i:C * i + C]))
    kinds = [(c.kind, c.step) for c in res.conversations]
    # the query is the memory "k3 points to k7": BM25 puts the pointer chunk (4 terms) before the value chunk (1)
    assert kinds == [("memory", i) for i in range(k)] + [("query", k), ("memory", pointer_chunk),
                                                        ("memory", value_chunk), ("final", k)]
    query = next(c for c in res.conversations if c.kind == "query")
    assert query.text == "k3 points to k7"
    assert query.prompt == render(LOOKUP_QUERY_TEMPLATE, question=res.question, memory="k3 points to k7")
    [rec] = [r for r in records if r.get("kind") == "query"]
    assert [(h["chunk"], h["start"], h["end"]) for h in rec["hits"]] == [
        (pointer_chunk, C * pointer_chunk, C * pointer_chunk + C), (value_chunk, C * value_chunk, C * value_chunk + C)]
    hit_records = [r for r in records if "chunk_start" in r][k:]  # the hits' memory records: offsets as evidence
    assert [(r["step"], r["chunk_start"]) for r in hit_records] == [(pointer_chunk, C * pointer_chunk),
                                                                    (value_chunk, C * value_chunk)]
    assert hit_records[0]["memory"] == "k3 points to k7"
    assert hit_records[1]["memory"] == res.memory == "k3 points to k7; k7 is v5"
    hit_prompt = backend.batches[k + 2][0]
    assert hit_prompt == f"Q:{res.question}|M:k3 points to k7|C:{tiny_tokenizer.decode(ids[C * value_chunk:C * value_chunk + C])}|"


def test_on_the_other_order_both_answer(tiny_tokenizer):
    doc, _ = _two_hop(tiny_tokenizer, value_first=False)
    assert _run(tiny_tokenizer, doc, "memagent")[0].answer == "v5"
    assert _run(tiny_tokenizer, doc)[0].answer == "v5"


HOSTILE_QUERIES = ['"k7" OR', "'; DROP TABLE chunks; --", "", "k7 " + "z" * 10240, "k7\x00\x00", "\ud800k7",
                   "text:k7", "NEAR(k7 v5) NOT k3*"]


@pytest.mark.parametrize("query", HOSTILE_QUERIES, ids=[repr(q[:20]) for q in HOSTILE_QUERIES])
def test_whatever_the_model_writes_as_a_query_the_run_goes_on(tiny_tokenizer, tmp_path, query):
    doc, ids = _two_hop(tiny_tokenizer, value_first=True)
    k = -(-len(ids) // C)
    res, records, _ = _run(tiny_tokenizer, doc, reply=lambda p, c: one_fact_reader(p, c, query), hits=1)
    trace = tmp_path / "t.jsonl"  # the trace file takes the query as written (a lone surrogate becomes "?")
    _run(tiny_tokenizer, doc, reply=lambda p, c: one_fact_reader(p, c, query), hits=1, trace_path=trace)
    [written] = [r for r in map(json.loads, trace.read_text().splitlines()) if r.get("kind") == "query"]
    [rec] = [r for r in records if r.get("kind") == "query"]
    assert written["query"] == rec["query"] == query.strip().replace("\ud800", "?")
    assert written["hits"] == rec["hits"]
    found = [h["chunk"] for h in rec["hits"]]
    if "k7" in query:  # plain words: the word k7 finds a chunk that holds it
        assert len(found) == 1 and "k7" in tiny_tokenizer.decode(ids[C * found[0]:C * found[0] + C])
    else:
        assert found == []
    assert res.calls == k + 1 + len(found) + 1 and res.error is None
    value_found = bool(found) and "k7 is" in tiny_tokenizer.decode(ids[C * found[0]:C * found[0] + C])
    assert res.answer == ("v5" if value_found else "unknown")


def test_more_lookups_leave_out_the_chunks_already_looked_at(tiny_tokenizer):
    doc, ids = _two_hop(tiny_tokenizer, value_first=True)
    k = -(-len(ids) // C)
    res, records, _ = _run(tiny_tokenizer, doc, reply=lambda p, c: one_fact_reader(p, c, "k7"), lookups=3, hits=1)
    hits = [[h["chunk"] for h in r["hits"]] for r in records if r.get("kind") == "query"]
    with_k7 = [i for i in range(k) if "k7" in tiny_tokenizer.decode(ids[C * i:C * i + C])]
    assert len(with_k7) == 2 and sorted(sum(hits, [])) == with_k7 and hits[2] == []  # third: nothing left
    assert [c.kind for c in res.conversations][k:] == ["query", "memory", "query", "memory", "query", "final"]
    assert res.calls == k + 3 + 2 + 1


def test_query_calls_of_many_documents_share_one_batch_with_their_own_budget(tiny_tokenizer):
    doc, _ = _two_hop(tiny_tokenizer)
    backend = ScriptedBackend(tiny_tokenizer, one_fact_reader)
    wf = build_workflow("lookup", backend, _config(), lookup_tokens=24)
    items = [AgentInput("what does k3 point to? give its value", doc, f"d{i}") for i in range(3)]
    assert [r.answer for r in run_workflow(wf, items)] == ["v5"] * 3
    [(batch, params)] = [(b, p) for b, p in zip(backend.batches, backend.params) if "Search query:" in b[0]]
    assert len(batch) == 3 and all("Search query:" in p for p in batch) and params.max_new_tokens == 24


def test_the_window_check_counts_the_query_call_exactly(tiny_tokenizer):
    cfg = _config(memory_tokens=8, query_tokens=10)
    probe = ScriptedBackend(tiny_tokenizer, one_fact_reader)
    empty = probe.prompt_length(render(LOOKUP_QUERY_TEMPLATE, question="", memory=""))
    overhead = template_overhead(probe, LOOKUP_QUERY_TEMPLATE)
    assert overhead == empty + 2  # "\n\n" is one token in the empty render, "\n" + "\n" around filled fields
    need = overhead + 10 + 8 + 200  # the query call outgrows every memagent call at lookup_tokens=200
    memagent_need = probe.prompt_length(render(TEMPLATE_MEM, question="", memory="", chunk="")) + 10 + C + 2 * 8
    assert need > memagent_need
    question = "k1 k2 k3 k4 k5"
    assert len(tiny_tokenizer(question, add_special_tokens=False)["input_ids"]) == 10  # the whole query budget
    long_memory = lambda p, c: "m " * 40 if "|C:" in p else ("k7" if "Search query:" in p else "\\boxed{x}")
    for window, ok in ((need - 1, False), (need, True)):
        backend = ScriptedBackend(tiny_tokenizer, long_memory, max_window=window)
        wf = build_workflow("lookup", backend, cfg, lookup_tokens=200)
        if not ok:
            with pytest.raises(BudgetError, match=rf"lookup query call needs up to {need} tokens .* window is {window}"):
                run_workflow(wf, [AgentInput(question, "k7 is v5 " * 30)])
            assert backend.batches == []  # nothing was sent
            continue
        [res] = run_workflow(wf, [AgentInput(question, "k7 is v5 " * 30)])
        sent = [(p, prm.max_new_tokens) for b, prm in zip(backend.batches, backend.params) for p in b]
        worst = max(backend.prompt_length(p) + n for p, n in sent)
        query_call = [backend.prompt_length(p) + n for p, n in sent if "Search query:" in p]
        assert query_call == [need] and worst == need  # a full memory and question: the bound is reached, not passed
        assert res.memory and len(tiny_tokenizer(res.memory, add_special_tokens=False)["input_ids"]) == 8


@pytest.mark.parametrize("options,message", [
    (dict(lookups=0), "lookups must be an integer from 1 to 4"), (dict(lookups=MAX_LOOKUPS + 1), "lookups"),
    (dict(hits=0), "hits must be an integer from 1 to 8"), (dict(hits=MAX_HITS + 1), "hits"),
    (dict(hits="two"), "hits"), (dict(hits=True), "hits"), (dict(lookup_tokens=257), "lookup_tokens"),
    (dict(k=3), r"workflow lookup has no option k; its options are lookups, hits"),
    (dict(query_template="Q:{question} only"), r"lookup query template lacks the placeholder\(s\) \{memory\}"),
    (dict(query_template="{question}{memory}{chunk}"), r"lookup query template has placeholder\(s\) \{chunk\}"),
    (dict(query_template=7), "query_template must be a string, got int"),
])
def test_options_are_bounded_and_checked(tiny_tokenizer, options, message):
    with pytest.raises(ConfigError, match=message):
        build_workflow("lookup", ScriptedBackend(tiny_tokenizer, one_fact_reader), _config(), **options)


def test_a_query_template_of_ones_own_is_the_query_calls_prompt(tiny_tokenizer):
    """The query call renders `query_template` (the demo's toy models use a short one); the run is the default
    template's otherwise: the same hits read, the same answer."""
    doc, _ = _two_hop(tiny_tokenizer, value_first=True)
    template = "Search query: M:{memory}|Q:{question}|"  # the scripted reader queries on "Search query:"
    res, records, backend = _run(tiny_tokenizer, doc, hits=2, query_template=template)
    base, _, _ = _run(tiny_tokenizer, doc, hits=2)
    query = [p for b in backend.batches for p in b if p.startswith("Search query:")]
    assert query == [render(template, question="what does k3 point to? give its value", memory="k3 points to k7")]
    assert res.answer == base.answer == "v5"
    assert [(c.kind, c.step) for c in res.conversations] == [(c.kind, c.step) for c in base.conversations]


def test_options_from_a_command_line_are_read_as_integers(tiny_tokenizer):
    wf = build_workflow("lookup", ScriptedBackend(tiny_tokenizer, one_fact_reader), _config(), lookups="2", hits="3")
    assert wf.workflow is lookup and (wf.own.lookups, wf.own.hits, wf.name) == (2, 3, "lookup")


def test_index_files_go_to_the_run_folder_and_are_removed_unless_kept(tiny_tokenizer, tmp_path):
    doc, ids = _two_hop(tiny_tokenizer)
    k = -(-len(ids) // C)
    _run(tiny_tokenizer, doc, index_dir=tmp_path / "a")
    assert list((tmp_path / "a").iterdir()) == []
    _run(tiny_tokenizer, doc, index_dir=tmp_path / "b", keep_index=True)
    [kept] = (tmp_path / "b").iterdir()
    assert kept.name == "000000-d.sqlite"
    import sqlite3
    con = sqlite3.connect(kept)
    assert con.execute("SELECT count(*), min(start_token), max(end_token) FROM chunks").fetchone() == (k, 0, len(ids))
    con.close()


def test_a_failed_query_call_is_recorded_and_its_index_removed(tiny_tokenizer, tmp_path):
    def reply(prompt, call):
        if "Search query:" in prompt:
            raise BackendError("the server went away")
        return one_fact_reader(prompt, call)

    doc, ids = _two_hop(tiny_tokenizer)
    wf = build_workflow("lookup", ScriptedBackend(tiny_tokenizer, reply), _config(), failures="record",
                        keep_conversations=True, index_dir=tmp_path)
    [res] = run_workflow(wf, [AgentInput("q?", doc, "d")])
    assert res.answer is None and res.error["kind"] == "BackendError" and "went away" in res.error["message"]
    assert [c.kind for c in res.conversations] == ["memory"] * (-(-len(ids) // C))
    assert list(tmp_path.iterdir()) == []


def test_an_empty_document_makes_no_lookup(tiny_tokenizer):
    res, records, backend = _run(tiny_tokenizer, "")
    assert [c.kind for c in res.conversations] == ["final"] and res.calls == 1 and res.num_chunks == 0


def test_greedy_lookup_on_the_tiny_model_is_deterministic_and_traced(tiny_backend, tmp_path):
    doc, ids = _two_hop(tiny_backend.tokenizer)
    k = -(-len(ids) // C)
    cfg = AgentConfig(chunk_tokens=C, memory_tokens=8, answer_tokens=6, query_tokens=16)
    runs = []
    for n in range(2):
        trace = tmp_path / f"t{n}.jsonl"
        wf = build_workflow("lookup", tiny_backend, cfg, keep_conversations=True, trace_path=trace, hits=2,
                            lookup_tokens=8)
        [res] = run_workflow(wf, [AgentInput("what does k3 point to?", doc, "d")])
        records = [json.loads(line) for line in trace.read_text().splitlines()]
        runs.append((res, records))
    (a, rec_a), (b, rec_b) = runs
    assert a.raw_answer == b.raw_answer and [c.response_ids for c in a.conversations] == \
        [c.response_ids for c in b.conversations]
    [q] = [r for r in rec_a if r.get("kind") == "query"]
    n_hits = len(q["hits"])
    assert [c.kind for c in a.conversations] == ["memory"] * k + ["query"] + ["memory"] * n_hits + ["final"]
    assert a.calls == k + 1 + n_hits + 1 == len(rec_a)
    query = a.conversations[k]
    assert query.prompt_ids and 0 < len(query.response_ids) <= 8 and query.step == k
    for h in q["hits"]:  # each hit is a real chunk at its offsets, read again with the memory
        assert (h["start"], h["end"]) == (C * h["chunk"], min(C * h["chunk"] + C, len(ids)))
    assert [c.step for c in a.conversations[k + 1:k + 1 + n_hits]] == [h["chunk"] for h in q["hits"]]


def test_pipelined_on_a_concurrent_backend_gives_the_lock_step_results(tiny_tokenizer):
    doc, _ = _two_hop(tiny_tokenizer)
    items = [AgentInput("what does k3 point to? give its value", doc, f"d{i}") for i in range(3)]
    lock = run_workflow(build_workflow("lookup", ScriptedBackend(tiny_tokenizer, one_fact_reader), _config(),
                                       keep_conversations=True), items)
    concurrent = ScriptedBackend(tiny_tokenizer, one_fact_reader)
    concurrent.max_concurrency = 2
    piped = run_workflow(build_workflow("lookup", concurrent, _config(), keep_conversations=True,
                                        schedule="pipelined"), items)
    assert [r.answer for r in piped] == [r.answer for r in lock] == ["v5"] * 3
    assert [[(c.kind, c.step, c.text) for c in r.conversations] for r in piped] == \
        [[(c.kind, c.step, c.text) for c in r.conversations] for r in lock]


def test_a_lookup_rollout_trains_the_query_conversation_with_the_samples_advantage(tiny_tokenizer):
    """One question, G = 2 rollouts of the two-hop document (value first). The first final reply is "v5"
    (reward 1), the second "no" (reward 0): advantages R - group mean = +0.5 and -0.5, each broadcast to every
    row of its sample: K memory rows, the query row, 2 hit rows and the final row."""
    import torch

    from memagent.rl.rollout import generate_rollouts
    from memagent.rl.samples import QASample

    doc, ids = _two_hop(tiny_tokenizer)
    k = -(-len(ids) // C)
    finals = iter(["\\boxed{v5}", "\\boxed{no}"])

    def reply(prompt, call):
        return next(finals) if prompt.endswith("|A:") else one_fact_reader(prompt, call)

    backend = ScriptedBackend(tiny_tokenizer, reply)
    sample = QASample("1", "what does k3 point to? give its value", doc, ["v5"])
    batch = generate_rollouts(backend, _config(), [sample], [0], 2, lambda raw, golds: float("v5" in raw),
                              seed=0, workflow="lookup", workflow_options=dict(hits=2)).with_advantages()
    rows = k + 1 + 2 + 1
    assert batch.sample_index.tolist() == [0] * rows + [1] * rows
    assert batch.is_final.tolist() == ([False] * (rows - 1) + [True]) * 2
    assert batch.rewards.tolist() == [1.0, 0.0]
    assert torch.equal(batch.advantages, torch.tensor([0.5] * rows + [-0.5] * rows))
    query_ids = tiny_tokenizer("k3 points to k7", add_special_tokens=False)["input_ids"]
    assert batch.response_ids[k] == batch.response_ids[rows + k] == query_ids  # the query row, in both samples
    prompt = tiny_tokenizer(render(LOOKUP_QUERY_TEMPLATE, question=sample.question, memory="k3 points to k7"),
                            add_special_tokens=False)["input_ids"]
    assert batch.prompt_ids[k] == prompt
