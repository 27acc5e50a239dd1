"""Per-step error rates of a toy memory agent: one memory update at a time, greedy.

A long document multiplies every per-step error by the number of chunks it applies to, so these
rates explain a length curve where accuracy at the training length (4 chunks) cannot: a 3% error
per step costs ~5 points there and leaves ~38% after 32 more chunks. Five cases, each from `n`
random (memory, chunk, question) states of the toy task:

- keep: the memory holds the asked fact, the chunk another one; the right update keeps the value.
  `value_lost`: the new memory's value is not the held one; `took_chunk_value`: it is the chunk's
  (the typical slip: "k3 v27" + "fact k2 v22" -> "k3 v22").
- write_empty: the memory is empty, the chunk holds the asked fact; `missed`: its value not written.
- write_over: the memory holds another fact, the chunk the asked one; `missed` likewise.
- ignore_empty / ignore_other: neither the memory (empty / another fact) nor the chunk holds the asked
  key; `claimed`: the new memory names the asked key anyway ("k2 v22" + Q k5 -> "k5 v22"). A
  policy that keeps whatever memory already names the asked key then skips the real fact when its
  chunk comes: before the answer's chunk a long document has many such steps, a short one few.
"""
from __future__ import annotations

import random
from dataclasses import replace

from memagent.agent.workflow import AgentInput, MemoryAgent
from memagent.backends.base import Backend
from memagent.config import AgentConfig
from memagent.tasks.toy import ToySpec, chunk_text, random_chunk

CASES = ("keep", "write_empty", "write_over", "ignore_empty", "ignore_other")


def update_states(spec: ToySpec, case: str, n: int, seed: int, empty_memory: str) -> list[dict[str, str]]:
    """n states of one case: {question, memory, chunk, value (the asked one), other (the distractor value: the
    chunk's when keeping, the memory's when writing over; always differs from value)}. In the ignore cases
    neither the memory nor the chunk holds the asked key."""
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
        elif case.startswith("ignore"):  # no asked fact anywhere: `value` and `other` are unused
            facts = random_chunk(rng, spec, q)
            memory = empty_memory if case == "ignore_empty" else f"{k2} {other}"
        else:
            facts = random_chunk(rng, spec, q, (q, v))
            memory = empty_memory if case == "write_empty" else f"{k2} {other}"
            other = "" if case == "write_empty" else other
        states.append(dict(question=q, memory=memory, chunk=chunk_text(rng, spec, facts), value=v, other=other))
    return states


def memory_updates(backend: Backend, config: AgentConfig, states: list[dict[str, str]]) -> list[str]:
    """The memory that one greedy update writes from each state ({question, memory, chunk}), made by the
    library's own memory step: `MemoryAgent` over a one-chunk document that starts from the state's memory
    (prompt, sampling, think handling and the M-token cap exactly as in a real run; the final answer it also
    makes is not used)."""
    agent = MemoryAgent(backend, replace(config, temperature=0.0), keep_conversations=True)
    results = agent.run([AgentInput(s["question"], s["chunk"], f"state-{i}", memory=s["memory"])
                         for i, s in enumerate(states)])
    updates = []
    for i, r in enumerate(results):
        steps = [c for c in r.conversations if c.kind == "memory"]
        if len(steps) != 1:
            raise ValueError(f"state {i}: its chunk made {len(steps)} memory updates, not one; a state's chunk "
                             f"must fit in chunk_tokens = {config.chunk_tokens}")
        updates.append(steps[0].text)
    return updates


def update_errors(backend: Backend, spec: ToySpec, config: AgentConfig, n: int = 1000,
                  seed: int = 0) -> dict[str, dict[str, float]]:
    """Greedy error rates of one memory update per case (see the module doc), each over n states, through the
    agent's own memory step with its templates, empty memory and memory budget (`config`)."""
    out: dict[str, dict[str, float]] = {}
    for case in CASES:
        states = update_states(spec, case, n, seed, config.empty_memory)
        updates = memory_updates(backend, config, states)
        values = [(text.split() or [""])[-1] for text in updates]
        lost = sum(v != s["value"] for v, s in zip(values, states)) / n
        if case == "keep":
            took = sum(v == s["other"] for v, s in zip(values, states)) / n
            out[case] = {"value_lost": lost, "took_chunk_value": took}
        elif case.startswith("ignore"):
            keys = [(text.split() or [""])[0] for text in updates]
            out[case] = {"claimed": sum(k == s["question"] for k, s in zip(keys, states)) / n}
        else:
            out[case] = {"missed": lost}
    return out
