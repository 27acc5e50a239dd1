"""The demo's evaluation (phase 5): the three models at every length, greedy, with the RL model's accuracy by
asked key, its failure kinds at 16x (demo/failures.py) and the per-step error rates (demo/diagnose.py)."""
from __future__ import annotations

from typing import Any, Callable

from memagent.agent.answer import extract_boxed
from memagent.agent.registry import DEFAULT_WORKFLOW, AgentInput, build_workflow, run_workflow
from memagent.backends.base import SamplingParams
from memagent.demo.config import EMPTY_MEMORY, METHODS, DemoConfig, agent_config, full_prompt
from memagent.demo.diagnose import update_errors
from memagent.demo.failures import accuracy, accuracy_by_key, failure_kinds
from memagent.eval.baselines import middle_truncate
from memagent.tasks.toy import ToySpec


def toy_backend(model: Any, tokenizer: Any, max_batch_size: int) -> Any:
    """The transformers backend over a demo model: plain prompts (the toy tokenizer has no chat template)."""
    from memagent.backends.hf import TransformersBackend  # lazy: torch

    return TransformersBackend(model.eval(), tokenizer, use_chat_template=False, max_batch_size=max_batch_size)


def run_memagent(model: Any, tokenizer: Any, samples: list[dict[str, Any]], spec: ToySpec,
                 keep_conversations: bool = False, workflow: str = DEFAULT_WORKFLOW,
                 workflow_options: dict[str, Any] | None = None) -> list[Any]:
    """The greedy workflow (by name, memagent.agent.registry; the paper's by default) over toy samples: one
    AgentResult each, in order (with every model call kept when `keep_conversations`, for demo/failures.py)."""
    backend = toy_backend(model, tokenizer, len(samples))
    agent = build_workflow(workflow, backend, agent_config(spec, batch_docs=len(samples)), progress=True,
                           keep_conversations=keep_conversations, **(workflow_options or {}))
    return run_workflow(agent, [AgentInput(s["question"], s["context"], s["id"]) for s in samples])


def eval_full_context(model: Any, tokenizer: Any, samples: list[dict[str, Any]], window: int) -> float:
    backend = toy_backend(model, tokenizer, 64)
    prompts = [full_prompt(s["question"], middle_truncate(s["context"], tokenizer, window).context) for s in samples]
    gens = backend.generate(prompts, SamplingParams(max_new_tokens=3))
    return sum(extract_boxed(g.text) == s["answers"][0] for g, s in zip(gens, samples)) / len(samples)


def update_step_errors(model: Any, tokenizer: Any, spec: ToySpec, n: int, seed: int) -> dict[str, dict[str, float]]:
    return update_errors(toy_backend(model, tokenizer, 256), spec, agent_config(spec), n=n, seed=seed + 20_000)


def evaluate(cfg: DemoConfig, models: dict[str, Any], tokenizer: Any, evals: dict[int, list[dict[str, Any]]],
             log: Callable[[str], None]) -> dict[str, Any]:
    """Phase 5: accuracy of the three models (`models` keyed by METHODS) at every length, the RL model's accuracy
    by asked key and its failure kinds at 16x, and both memagent models' per-step error rates."""
    spec = cfg.spec
    model, no_rl, fc_model = (models[m] for m in METHODS)
    window = cfg.train_chunks * spec.chunk_tokens
    acc: dict[str, dict[str, float]] = {m: {} for m in METHODS}
    by_key: dict[str, dict[str, float]] = {}  # the RL model's accuracy by asked key: a key it confuses stands out
    failures: dict[str, dict[str, int]] = {}  # where the RL model's failed documents broke, at 16x
    for mult in cfg.multiples:
        samples = evals[mult]
        traced = mult == 16  # keep the 16x conversations for the failure kinds
        answered = run_memagent(model, tokenizer, samples, spec, keep_conversations=traced)
        acc["memagent-rl"][str(mult)] = accuracy(answered, samples)
        by_key[str(mult)] = accuracy_by_key(answered, samples)
        if traced:
            failures[str(mult)] = failure_kinds(answered, samples, EMPTY_MEMORY)
        del answered  # the 16x conversations are large
        acc["memagent-no-rl"][str(mult)] = accuracy(run_memagent(no_rl, tokenizer, samples, spec), samples)
        acc["full-context"][str(mult)] = eval_full_context(fc_model, tokenizer, samples, window)
        log(f"{mult}x ({cfg.train_chunks * mult} chunks): " + ", ".join(f"{m} {acc[m][str(mult)]:.3f}" for m in METHODS))
    # per-step error rates (demo/diagnose.py): why accuracy falls with length, one memory update at a time
    errors = {name: update_step_errors(m, tokenizer, spec, 256 if cfg.quick else 1000, cfg.seed)
              for name, m in (("memagent-rl", model), ("memagent-no-rl", no_rl))}
    for name, e in errors.items():
        log(f"{name} per-step errors: " + ", ".join(f"{c} {k} {100 * v:.1f}%" for c, d in e.items() for k, v in d.items()))
    return {"accuracy": acc, "update_errors": errors, "failures": failures, "by_key": by_key}
