"""The sweep's reading workflows (memagent.agent.registry): which methods are workflows, their settings
fingerprint, their window check, and a sample's model usage counted from its trace records.

A method of the sweep is a baseline ("full-context", "rag-bm25") or a workflow name ("memagent", "lookup",
"skim", or one a package registers). A workflow's records carry its name as `method` and a fingerprint that
folds in its name and its own options (`SweepConfig.workflows`, `{name, options}` each), so two workflows, or one under
other options, never share records; `memagent` without options keeps the sweep's plain fingerprint (the one
its records had before workflows were pluggable: earlier results resume).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable

from memagent.agent.registry import DEFAULT_WORKFLOW, build_workflow, workflow_names
from memagent.tasks.schema import count_tokens

BASELINES = ("full-context", "rag-bm25")


def is_workflow(method: str) -> bool:
    return method not in BASELINES


def check_methods(methods: Iterable[str]) -> list[str]:
    """The methods that are not baselines and not known workflows (memagent.agent.registry names them)."""
    known = set(workflow_names())
    return [m for m in methods if is_workflow(m) and m not in known]


def method_fingerprint(base: str, method: str, options: dict[str, Any] | None) -> str:
    """The settings fingerprint of `method`'s records: the sweep's `base` for a baseline and for memagent
    without options, else sha256 (16 hex digits) of [base, workflow name, its options]."""
    if not is_workflow(method) or (method == DEFAULT_WORKFLOW and not options):
        return base
    text = json.dumps([base, method, options or {}], sort_keys=True, ensure_ascii=False, separators=(",", ":"),
                      default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def build_runners(backend: Any, cfg: Any) -> dict[str, Any]:
    """{workflow method: its Runner on `backend`} under the sweep's agent settings, each built once from the
    workflow `cfg.bound` holds (looked up and checked once) and its window checked (`check_budget([])`) before
    any model call; a unit runs `runner.bind(...)` with its repeat's seed and its own run options."""
    runners = {}
    for m, bound in cfg.bound.items():
        runners[m] = build_workflow(bound, backend, cfg.agent)
        runners[m].check_budget([])
    return runners


def count_call(u: dict[str, int], call: dict, tokenizer: Any) -> None:
    """Add one trace record's tokens to a sample's usage {prompt, generated, calls, document}.

    A memory update (no `kind`, or "memory") generated its memory and read its chunk; the final call its raw
    answer; a call of another kind counts `generated_tokens` (or `memory_tokens`) and any `chunk_tokens` it read."""
    u["calls"] += 1
    u["prompt"] += call.get("prompt_tokens", 0)
    kind = call.get("kind", "memory")
    if kind == "final":
        u["generated"] += count_tokens(tokenizer, call["raw_answer"])
    elif kind == "memory":
        u["generated"] += call["memory_tokens"]
        u["document"] += call["chunk_tokens"]
    else:
        u["generated"] += call.get("generated_tokens", call.get("memory_tokens", 0))
        u["document"] += call.get("chunk_tokens", 0)
