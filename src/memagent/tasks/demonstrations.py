"""Warm-up demonstrations built from gold evidence: what a good memory policy writes, conversation by conversation.

The paper starts RL from instruction-tuned 7B/14B models that already follow its prompts. A small model does not
(docs/real_model.md: SmolLM2-135M writes no `\\boxed{}` and repeats itself), so every rollout earns 0 and every
advantage is 0. This module writes the supervised warm-up that comes first (NOT in the paper; the demo's "workflow
without RL" phase for a real model): for a sample that carries `evidence` (the gold strings that answer it: RULER's
queried needles, variable tracking's chain, the toy facts), each conversation of the paper's workflow with the
reply an ideal policy would give:

    memory_0 = config.empty_memory
    for chunk k of the document (the agent's own chunking: same tokenizer, same C):
        prompt_k   = memory_template(question, memory_k, chunk_k)
        memory_k+1 = the evidence strings seen in chunks 0..k, in document order, joined by a space,
                     or NOTHING_YET when none has been seen           (question-aware: distractors never kept)
    final prompt = final_template(question, memory_K),  reply = \\boxed{gold answers joined by ", "}

Every memory is checked to fit M tokens of the model's tokenizer. A sample is left out (and counted by reason)
when an evidence string is not inside one chunk: absent from the text, or cut by a chunk boundary, where no
single memory update could have copied it whole; or when its evidence does not fit M tokens.
With `keep_distractors`, the sample's `distractors` (strings shaped like evidence that answer another question:
RULER's needles under keys not asked for) are kept too, each with its own key, so the memory copies every needle
whole and the final step picks the one asked for; a distractor cut by a chunk boundary is left out of the memory
(no single update could have copied it), never the sample.
`keep_idle` keeps that share of the updates that read nothing and write NOTHING_YET again (seeded), the rows
that cost the most compute and teach the least; the first such update of each sample is always kept.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from memagent.agent.chunking import iter_chunks
from memagent.config import AgentConfig
from memagent.prompts import render
from memagent.tasks.base import DataError, count_tokens

__all__ = ["NOTHING_YET", "DemoStats", "demonstrations", "iter_demonstrations"]

NOTHING_YET = "Nothing relevant to the problem yet."  # the memory while no evidence has been read


@dataclass
class DemoStats:
    """What `iter_demonstrations` did: samples used, samples skipped by reason, rows written by kind."""

    samples: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> samples
    rows: Counter = field(default_factory=Counter)  # "memory" / "final" -> rows

    def line(self) -> str:
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items())) or "none"
        return (f"{self.rows['memory'] + self.rows['final']} rows ({self.rows['memory']} memory updates, "
                f"{self.rows['final']} final answers) from {self.samples} samples; skipped: {skipped}")


class SkipSample(Exception):
    """This sample cannot be demonstrated; the message is the reason counted in DemoStats.skipped."""


def boxed_answer(answers: list[str]) -> str:
    """The final reply that the `boxed` verifier and string_match_all both accept: every gold answer, boxed."""
    return "\\boxed{" + ", ".join(answers) + "}"


def demonstrations(sample: dict[str, Any], tokenizer: Any, config: AgentConfig, *, keep_idle: float = 1.0,
                   keep_distractors: bool = False, rng: random.Random | None = None) -> list[dict[str, Any]]:
    """The rows {id, kind, step, prompt, response} of one sample (see the module docstring).

    Raises SkipSample when the sample cannot be demonstrated, DataError when it has no evidence or answers.
    """
    evidence, answers = sample.get("evidence"), sample.get("answers")
    if not evidence:
        raise DataError(f"sample {sample.get('id')!r} has no `evidence`: a demonstration needs the gold strings "
                        "the memory should keep (memagent data ruler writes them)")
    if not answers:
        raise DataError(f"sample {sample.get('id')!r} has no `answers`")
    text = sample.get("context")
    if not isinstance(text, str):
        raise DataError(f"sample {sample.get('id')!r}: demonstrations need a `context` string")
    chunks = [c.text for c in iter_chunks(text, tokenizer, config.chunk_tokens)]

    def locate(s: str) -> tuple[int, int] | None:
        """(chunk index, offset in the chunk) of the first chunk holding `s` whole, None when none does."""
        return next(((k, c.find(s)) for k, c in enumerate(chunks) if s in c), None)

    where = [locate(e) for e in evidence]
    if None in where:
        raise SkipSample("evidence not inside one chunk (absent, or cut by a chunk boundary)")
    distractors = sample.get("distractors") or [] if keep_distractors else []
    if not isinstance(distractors, list) or not all(isinstance(d, str) and d for d in distractors):
        raise DataError(f"sample {sample.get('id')!r}: `distractors` must be a list of non-empty strings")
    kept = list(evidence)
    for d in distractors:
        if (at := locate(d)) is not None:  # one cut by a chunk boundary stays out of the memory
            kept.append(d)
            where.append(at)
    order = sorted(range(len(kept)), key=lambda i: where[i])
    rows: list[dict[str, Any]] = []
    rng = rng or random.Random(0)
    memory, first_idle = config.empty_memory, True
    for k, chunk in enumerate(chunks):
        seen = [kept[i] for i in order if where[i][0] <= k]
        new = " ".join(seen) if seen else NOTHING_YET
        if count_tokens(tokenizer, new) > config.memory_tokens:
            if not seen:
                raise DataError(f"M = {config.memory_tokens} tokens cannot hold the memory {NOTHING_YET!r} "
                                f"({count_tokens(tokenizer, new)} tokens); raise --memory-tokens")
            raise SkipSample(f"evidence over M = {config.memory_tokens} tokens")
        idle = new == NOTHING_YET
        if not idle or first_idle or rng.random() < keep_idle:
            rows.append({"id": sample.get("id"), "kind": "memory", "step": k,
                         "prompt": render(config.memory_template, question=sample["question"], memory=memory,
                                          chunk=chunk), "response": new})
        first_idle = first_idle and not idle
        memory = new
    rows.append({"id": sample.get("id"), "kind": "final", "step": len(chunks),
                 "prompt": render(config.final_template, question=sample["question"], memory=memory),
                 "response": boxed_answer(list(answers))})
    return rows


def iter_demonstrations(samples: Iterable[dict[str, Any]], tokenizer: Any, config: AgentConfig, stats: DemoStats,
                        *, keep_idle: float = 1.0, keep_distractors: bool = False,
                        seed: int = 0) -> Iterator[dict[str, Any]]:
    """The rows of every sample in order; `stats` counts what was used and skipped."""
    if not 0.0 <= keep_idle <= 1.0:
        raise DataError(f"keep_idle must be in [0, 1], got {keep_idle}")
    for sample in samples:
        rng = random.Random(f"demonstrations:{seed}:{sample.get('id')}")
        try:
            rows = demonstrations(sample, tokenizer, config, keep_idle=keep_idle, keep_distractors=keep_distractors,
                                  rng=rng)
        except SkipSample as e:
            stats.skipped[str(e)] += 1
            continue
        stats.samples += 1
        for row in rows:
            stats.rows[row["kind"]] += 1
            yield row
