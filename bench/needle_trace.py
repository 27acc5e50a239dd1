"""What a memory agent did with the needles of a RULER niah document set, read off its `memagent ask --trace`.

    memagent ask --backend vllm --model runs/recipe/warmup4-merged --input heldout-niah_multikey_1-2048.jsonl \
        --chunk-tokens 512 --memory-tokens 128 --answer-tokens 48 --query-tokens 128 \
        --trace trace.jsonl > answers.jsonl
    python bench/needle_trace.py runs/recipe/heldout-niah_multikey_1-2048.jsonl trace.jsonl answers.jsonl \
        --tokenizer <the model> [--chunk-tokens 512] [--json out.json]

The traces and answers of the shipped warm-up (round 2) and of rounds 4 and 5 over the 32 held-out 1x
niah_multikey_1 documents are committed (bench/results/needle_trace/), with what this script made of them
(bench/results/needle_trace_warmupN.json), and round 5's over its 4 wrong 16x niah_single_2 documents
(needle_trace_warmup5_16x.json), e.g.:

    python bench/needle_trace.py runs/recipe/heldout-niah_multikey_1-2048.jsonl \
        bench/results/needle_trace/warmup4-niah_multikey_1-2048.trace.jsonl \
        bench/results/needle_trace/warmup4-niah_multikey_1-2048.answers.jsonl --tokenizer <smollm2> \
        --json bench/results/needle_trace_warmup4.json

It counts, over every document:
  - pairs: each "... for KEY is: NUMBER" the last memory holds (held), and how many pair a number with the key it
    was read with in the document (own_key; a relabelled distractor pairs a number with another key, usually the
    question's);
  - updates: for each memory update that reads a needle not yet kept, how many needles the memory held before it,
    how many new ones its chunk holds, and how many of those numbers it wrote (the copy rate, by how full the memory
    was; "added" counts needles, the other keys updates);
  - idle: updates reading a chunk with no needle while the memory says nothing was found yet
    (`demonstrations.NOTHING_YET`, or the empty first memory), and the stray writes among them (any other memory);
    the documents that strayed before their first needle and how many of those were answered right (strayed_documents,
    strayed_documents_right). Past the window most updates are idle: a stray write rare at 1x decides 16x;
  - copies: updates reading no new needle while the memory holds some, and those after which a needle held is gone
    (needle_lost);
  - answers: right; the queried needle never in any memory; in the last memory but another picked (which one).
"""
from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict

from memagent.agent.chunking import iter_chunks
from memagent.backends.tokenizer import load_tokenizer
from memagent.io import atomic_write_text
from memagent.tasks.demonstrations import NOTHING_YET
from memagent.tasks.schema import read_samples

NEEDLE = re.compile(r"special magic \w+ for ([\w-]+) is: (\w+)")


def needles(text: str) -> list[tuple[str, str]]:
    """(key, value) of every needle sentence in `text`, in order."""
    return NEEDLE.findall(text)


def analyse(samples: dict[str, dict], trace: list[dict], answers: dict[str, dict], tokenizer,
            chunk_tokens: int) -> dict:
    steps: dict[str, list[dict]] = defaultdict(list)
    for row in trace:
        if row.get("kind") != "final":
            steps[row["doc_id"]].append(row)
    pairs, updates, outcome, idle, copies = Counter(), Counter(), Counter(), Counter(), Counter()
    read = added = 0  # needle numbers read by an update that did not hold them yet, and those it wrote
    for sid, sample in samples.items():
        if sid not in answers:
            continue
        truth = dict(needles(sample["context"]))
        gold, answer = sample["answers"][0], (answers[sid].get("answer") or "").strip()
        chunks = [c.text for c in iter_chunks(sample["context"], tokenizer, chunk_tokens)]
        memories = [s["memory"].strip() for s in sorted(steps[sid], key=lambda s: s["step"])]
        before: set[str] = set()
        ever = strayed = seen = False
        previous = NOTHING_YET
        for chunk, memory in zip(chunks, memories):
            after, found = {v for _, v in needles(memory)}, needles(chunk)
            new = [v for _, v in found if v not in before]
            if not found and previous == NOTHING_YET:
                idle["updates"] += 1
                idle["stray_writes"] += memory != NOTHING_YET
                strayed = strayed or (memory != NOTHING_YET and not seen)
            elif not new and before:
                copies["updates"] += 1
                copies["needle_lost"] += not before <= after
            seen, previous = seen or bool(found), memory
            if new:
                wrote = sum(v in after for v in new)
                read, added = read + len(new), added + wrote
                updates[f"{len(before)} in memory, {len(new)} new"] += 1
                updates[f"{len(before)} in memory, {len(new)} new: added"] += wrote
            ever = ever or gold in after
            before = after
        if strayed:
            idle["strayed_documents"] += 1
            idle["strayed_documents_right"] += answer == gold
        last = needles(memories[-1]) if memories else []
        pairs["held"] += len(last)
        pairs["own_key"] += sum(truth.get(k) == v for k, v in last)
        values = [v for _, v in last]
        if answer == gold:
            outcome["right"] += 1
        elif not ever:
            outcome["the queried needle never in the memory"] += 1
        elif gold not in values:
            outcome["the queried needle kept, then dropped"] += 1
        else:
            picked = values.index(answer) if answer in values else None
            where = ("not in the memory" if picked is None else
                     "an earlier needle" if picked < values.index(gold) else "a later needle")
            outcome[f"the queried needle in the last memory, picked {where}"] += 1
        outcome[f"last memory holds {len(last)} of {len(truth)} needles"] += 1
    return {"documents": len(answers), "needles_read": read, "needles_added": added, "pairs": dict(pairs),
            "updates": dict(sorted(updates.items())), "idle": dict(idle), "copies": dict(copies),
            "outcomes": dict(sorted(outcome.items()))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("trace")
    p.add_argument("answers")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--chunk-tokens", type=int, default=512)
    p.add_argument("--json")
    a = p.parse_args()
    samples = {s["id"]: s for s in read_samples(a.data)}
    trace = [json.loads(line) for line in open(a.trace) if line.strip()]
    answers = {r["id"]: r for r in map(json.loads, open(a.answers))}
    out = {"data": a.data, "trace": a.trace, "answers": a.answers, "chunk_tokens": a.chunk_tokens,
           **analyse(samples, trace, answers, load_tokenizer(a.tokenizer), a.chunk_tokens)}
    print(json.dumps(out, indent=2))
    if a.json:
        atomic_write_text(a.json, json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
