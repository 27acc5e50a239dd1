"""Per-step error rates of a toy memory agent: one memory update at a time, greedy.

Accuracy at N chunks is roughly (1 - e_keep) ** (chunks after the answer's chunk) times the chance of
writing the answer when its chunk comes, so these rates explain a length curve: a keep error of 3%
a step leaves ~38% after 32 more chunks, while it costs only ~5 points at the training length of 4
chunks. Three cases, each from `n` random (memory, chunk, question) states of the toy task:

- keep: the memory holds the asked fact, the chunk another one; the right update keeps the value.
  `value_lost`: the new memory's value is not the held one; `took_chunk_value`: it is the chunk's
  (the typical slip: "k32 v27" + "fact k23 v22" -> "k32 v22").
- write_empty: the memory is empty, the chunk holds the asked fact; `missed`: its value not written.
- write_over: the memory holds another fact, the chunk the asked one; `missed` likewise.

Only values count: the key a memory holds is the agent's own note, which the reward never checks.
"""
from __future__ import annotations

import random
from typing import Any

from memagent.agent.prompts import render
from memagent.agent.workflow import cap_tokens_many
from memagent.backends.base import Backend, SamplingParams
from memagent.config import AgentConfig
from memagent.tasks.toy import ToySpec, chunk_text, random_chunk

CASES = ("keep", "write_empty", "write_over")


def update_states(spec: ToySpec, case: str, n: int, seed: int, empty_memory: str) -> list[dict[str, str]]:
    """n states of one case: {question, memory, chunk, value (the asked one), other (the distractor value: the
    chunk's when keeping, the memory's when writing over; always differs from value)}."""
    if case not in CASES:
        raise ValueError(f"unknown case {case!r}; choose one of {', '.join(CASES)}")
    rng = random.Random(f"{seed}-{case}")
    states = []
    for _ in range(n):
        q, v = rng.choice(spec.keys), rng.choice(spec.values)
        k2 = rng.choice([k for k in spec.keys if k != q])
        other = rng.choice([x for x in spec.values if x != v])  # never the asked value: no lucky matches
        if case == "keep":
            facts = random_chunk(rng, spec, q, (k2, other))
            memory = f"{q} {v}"
        else:
            facts = random_chunk(rng, spec, q, (q, v))
            memory = empty_memory if case == "write_empty" else f"{k2} {other}"
            other = "" if case == "write_empty" else other
        states.append(dict(question=q, memory=memory, chunk=chunk_text(rng, spec, facts), value=v, other=other))
    return states


def update_errors(backend: Backend, spec: ToySpec, config: AgentConfig, n: int = 1000,
                  seed: int = 0) -> dict[str, dict[str, float]]:
    """Greedy error rates of one memory update per case (see the module doc), each over n states, with
    the agent's memory template, empty memory and memory budget (`config`)."""
    out: dict[str, dict[str, float]] = {}
    for case in CASES:
        states = update_states(spec, case, n, seed, config.empty_memory)
        prompts = [render(config.memory_template, question=s["question"], memory=s["memory"], chunk=s["chunk"])
                   for s in states]
        gens = backend.generate(prompts, SamplingParams(max_new_tokens=config.memory_tokens + 1))
        capped = cap_tokens_many([g.text.strip() for g in gens], backend.tokenizer, config.memory_tokens)  # as the workflow
        values = [(text.split() or [""])[-1] for text, _, _ in capped]
        lost = sum(v != s["value"] for v, s in zip(values, states)) / n
        if case == "keep":
            took = sum(v == s["other"] for v, s in zip(values, states)) / n
            out[case] = {"value_lost": lost, "took_chunk_value": took}
        else:
            out[case] = {"missed": lost}
    return out
