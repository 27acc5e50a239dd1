"""What both harness integrations run: one-message prompts through the read-write loop, in process.

`Harness(model, **args)` takes the harness's flat model arguments (lm-eval `--model_args k=v,...`, Inspect
`-M k=v`), builds the backend and the agent settings exactly as `memagent ask` does (built-in profile, the
model's memagent.json, `profile=FILE`, then the arguments), and answers prompts: each prompt is split by the
prompt rule (`memagent.split_prompt`) into document and question, all of them run as one batch, and
each answer comes with its memory timeline. `loglikelihood` scores a continuation after the question and the
final memory (the answer prompt): what multiple-choice tasks need.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from memagent.prompts import render
from memagent.agent.registry import build_workflow, get_workflow
from memagent.split_prompt import SplitRule, parse_rule, split_prompt
from memagent.agent.workflow import AgentInput, AgentResult
from memagent.ask.driver import AskOptions
from memagent.backends.options import BackendOptions
from memagent.errors import InputError
from memagent.flags import BudgetOptions, SamplingOptions, check_as, check_options
from memagent.protocol.profile import open_backend
from memagent.protocol.resolve import model_profile
from memagent.timeline import evidence_steps

_BACKEND = {"backend": "name", "base_url": "base_url", "tokenizer": "tokenizer", "device": "device", "dtype": "dtype",
            "tensor_parallel": "tensor_parallel", "max_concurrency": "max_concurrency",
            "request_timeout": "request_timeout", "max_retries": "max_retries"}
_BUDGETS = ("chunk_tokens", "memory_tokens", "answer_tokens", "query_tokens")
_SAMPLING = ("temperature", "top_p", "seed")
_WORKFLOW = ("workflow", "profile", "prompt_split", "batch_docs", "errors")
ARGS = tuple(_BACKEND) + _BUDGETS + _SAMPLING + _WORKFLOW


_TEXT = ("backend", "base_url", "tokenizer", "device", "dtype", "workflow", "profile", "prompt_split", "errors")


def _text(key: str, value: Any) -> str:
    """A text model argument as text: lm-eval and Inspect read `device=0` as the number 0, `dtype=true` as
    True; a number is taken back as the text it was, anything else refused."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise InputError(f"model argument {key} must be text, got {value!r}")


@dataclass
class Outcome:
    """One prompt's reply: `text` (the extracted answer, else the raw final reply stripped, as the service
    replies) and its memory `timeline` (JSON-able: question, steps with memories and offsets, calls, tokens)."""

    text: str
    timeline: dict[str, Any]


def reply_text(result: AgentResult) -> str:
    """The answer text a harness sees: `memagent serve`'s rule (the answer, else the raw reply stripped)."""
    return result.answer if result.answer is not None else result.raw_answer.strip()


class Harness:
    """A backend and agent settings built from a harness's model arguments; see the module docstring."""

    def __init__(self, model: str, **args: Any) -> None:
        unknown = sorted(set(args) - set(ARGS))
        if unknown:
            raise InputError(f"unknown memagent model argument(s) {', '.join(unknown)}; known: {', '.join(ARGS)}")
        args = {k: _text(k, v) if k in _TEXT else v for k, v in args.items() if v is not None}
        backend = BackendOptions(**{_BACKEND[k]: args[k] for k in _BACKEND if k in args})
        budgets = BudgetOptions(**{k: args.get(k) for k in _BUDGETS})
        sampling = SamplingOptions(**{k: args.get(k) for k in _SAMPLING})
        self.batch_docs = args.get("batch_docs", AskOptions.batch_docs)  # 0 or 'abc' refused below, not replaced
        self.errors = args.get("errors", AskOptions.errors)
        self.workflow = args.get("workflow", "memagent")  # a reading workflow by name (memagent.agent.registry)
        for options in (backend, budgets, sampling):  # every value named as given: `chunk_tokens`, not a flag
            check_options(options, by_key=True)
        check_as(AskOptions, by_key=True, batch_docs=self.batch_docs, errors=self.errors)  # `memagent ask`'s rules
        get_workflow(self.workflow)  # an unknown name lists the valid ones, before the model loads
        self.rule: SplitRule = parse_rule(args.get("prompt_split", "auto"))
        profile = model_profile(model, args.get("profile"), budgets, sampling)
        self.config = profile.agent_config(max_batch_docs=self.batch_docs)
        self.backend = open_backend(model, backend, profile)
        self.model = model

    def split(self, prompt: str, rule: SplitRule | None = None) -> tuple[str, str]:
        """(document, question) of a one-message prompt; InputError when the rule cannot split it."""
        rule = rule or self.rule
        try:
            return split_prompt(prompt, rule)
        except InputError as e:
            raise InputError(f"{e}; give the model argument prompt_split=line or separator:TEXT "
                             "(docs/harnesses.md lists the rule of each task family)") from None

    def run(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[AgentResult, dict[str, Any]]]:
        """Each (document, question) through the loop, as one batch: (result, timeline) per pair."""
        records: dict[str, list[dict[str, Any]]] = {str(i): [] for i in range(len(pairs))}
        agent = build_workflow(self.workflow, self.backend, self.config, errors=self.errors, keep_conversations=True,
                               on_step=lambda r: records[str(r["doc_id"])].append(r))
        results = agent.run([AgentInput(q, d, str(i)) for i, (d, q) in enumerate(pairs)])
        return [(r, _timeline(r, records[r.doc_id], self.config.empty_memory)) for r in results]

    def answer(self, prompts: Sequence[str], rule: SplitRule | None = None) -> list[Outcome]:
        """The reply and timeline of each one-message prompt."""
        return [Outcome(reply_text(r), dict(t, prompt_split=str(rule or self.rule)))
                for r, t in self.run([self.split(p, rule) for p in prompts])]

    def loglikelihood(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, bool]]:
        """(sum of the continuation tokens' log-probs, whether greedy decoding would write them) per
        (context, continuation): the context is split into document and question, the document read into a
        memory, and the continuation scored right after the answer prompt (final template with the question
        and the final memory, as the model reads it: chat template and generation prompt included)."""
        if not hasattr(self.backend, "model") or not hasattr(self.backend, "encode"):
            raise InputError("loglikelihood needs the model's logits: use the transformers backend "
                             "(backend=transformers), not an HTTP or vLLM one")
        runs = self.run([self.split(c) for c, _ in pairs])
        out = []
        for (result, _), (_, continuation) in zip(runs, pairs):
            prompt = render(self.config.final_template, question=result.question, memory=result.memory)
            out.append(continuation_score(self.backend, prompt, continuation))
        return out


def continuation_score(backend: Any, prompt: str, continuation: str) -> tuple[float, bool]:
    """(sum of log p(continuation token | prompt, earlier ones), every token the argmax) by one forward pass."""
    import torch  # lazy: torch

    prompt_ids = backend.encode(prompt)  # [P], chat template and generation prompt included
    cont_ids = list(backend.tokenizer(continuation, add_special_tokens=False)["input_ids"])  # [C]
    if not cont_ids:
        return 0.0, True
    device = next(backend.model.parameters()).device
    ids = torch.tensor([prompt_ids + cont_ids], device=device)  # (1, P + C)
    with torch.no_grad():
        logits = backend.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()  # (C, V)
    logp = torch.log_softmax(logits, dim=-1)
    target = torch.tensor(cont_ids, device=device)
    total = logp.gather(1, target[:, None]).sum().item()
    return total, bool((logp.argmax(-1) == target).all().item())


def _timeline(result: AgentResult, records: list[dict[str, Any]], empty_memory: str) -> dict[str, Any]:
    """A sample's memory timeline: each chunk's offset, size and the memory after it; the final answer;
    evidence (the steps whose words survive into the final memory); calls and tokens."""
    steps = [{k: r.get(k) for k in ("step", "chunk_start", "chunk_tokens", "memory", "memory_tokens", "prompt_tokens",
                                    "truncated")} for r in records if r.get("kind") != "final"]
    convs = result.conversations
    prompt_tokens = sum(len(c.prompt_ids) for c in convs if c.prompt_ids is not None)
    return dict(question=result.question, steps=steps, evidence=evidence_steps(steps, empty_memory),
                final_memory=result.memory, answer=result.answer, raw_answer=result.raw_answer,
                calls=len(convs), prompt_tokens=prompt_tokens,
                completion_tokens=sum(len(c.response_ids) for c in convs))
