"""The `judge` outcome reward: a model grades an open answer against the reference (NOT in the paper, whose
rule-based verifier cannot judge open answers; docs/rewards.md).

One prompt per answer, a fixed rubric (`RUBRIC`), greedy decoding of at most `max_tokens` tokens, and a strict
parse (`parse_score`): the reply, stripped, must be one plain decimal number in [0, 1] and nothing else ("1",
"0.5", ".75", "1.0"). Anything else (no number, "1e309", "0.5 but actually 1", a 10 KB essay) is unparseable:
asked again up to `retries` times, then scored 0 and counted (`stats["unparseable"]`), never a crash. A
backend error is retried the same way; a judge that cannot be reached at all after its retries raises
`JudgeError` (training on all-zero rewards would learn nothing). Scores are cached by (question, answer,
references), so the G rollouts of a question that write the same answer cost one call.

The backend is any memagent backend (`generate(prompts, params)`): pass one (`backend_object`, the Python
API), or name one in `reward_options` (`backend: openai`, `model`, `base_url`, `tokenizer`), loaded on first use.
"""
from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any, Sequence

from memagent.agent.answer import extract_boxed
from memagent.backends.base import BackendError, SamplingParams
from memagent.backends.options import BackendOptions
from memagent.errors import MemAgentError
from memagent.rewards.protocol import Answered

RUBRIC = """Grade an answer to a question against the reference answer.
Give 1 when the answer says the same as the reference (other wording is fine), 0 when it is wrong, missing or \
says something else, and a number between 0 and 1 when it is partly right.
Reply with the number only.

Question: {question}
Reference: {reference}
Answer: {answer}
Grade:"""

_SCORE = re.compile(r"(?:0(?:\.\d{1,6})?|1(?:\.0{1,6})?|\.\d{1,6})")  # a plain decimal in [0, 1]
MAX_REPLY_CHARS = 32  # longer replies are not a bare number: unparseable without looking further


class JudgeError(MemAgentError, RuntimeError):
    """The judge's backend could not be reached (after its retries) or is not set up."""


def parse_score(reply: str | None) -> float | None:
    """The grade in a judge's reply: the stripped reply must be one plain decimal in [0, 1]; None otherwise."""
    if reply is None or len(reply) > MAX_REPLY_CHARS:
        return None
    text = reply.strip()
    return float(text) if _SCORE.fullmatch(text) else None


def answer_text(reply: str | None) -> str:
    """What the judge grades: the last \\boxed{} of the reply, else the whole reply (stripped)."""
    if reply is None:
        return ""
    boxed = extract_boxed(reply)
    return (boxed if boxed is not None else reply).strip()


class JudgeReward:
    """`judge`: an outcome reward graded by a model (module doc)."""

    name, kind = "judge", "outcome"

    def __init__(self, backend_object: Any = None, *, backend: str = "openai", model: str = "",
                 base_url: str | None = None, tokenizer: str | None = None, retries: int = 2, max_tokens: int = 8,
                 request_retries: int = 2, cache_size: int = 100_000) -> None:
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise ValueError(f"judge: retries must be an integer >= 0, got {retries!r}")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"judge: max_tokens must be an integer >= 1, got {max_tokens!r}")
        if backend_object is None and not model:
            raise ValueError("judge: name the grading model (reward_options.model, with backend and base_url) "
                             "or pass backend_object=")
        self.backend = backend_object
        self.spec = {"name": backend, "model": model, "base_url": base_url, "tokenizer": tokenizer,
                     "max_retries": request_retries}
        self.retries, self.max_tokens, self.cache_size = retries, max_tokens, cache_size
        self.cache: OrderedDict[tuple[str, str, tuple[str, ...]], float] = OrderedDict()
        self.stats = {"calls": 0, "cached": 0, "unparseable": 0, "retried": 0}

    def _backend(self) -> Any:
        if self.backend is None:
            spec = self.spec
            opts = BackendOptions(name=spec["name"], base_url=spec["base_url"], tokenizer=spec["tokenizer"],
                                  max_retries=spec["max_retries"])
            try:
                self.backend = opts.load(spec["model"])
            except MemAgentError as e:
                raise JudgeError(f"judge: cannot open the grading model {spec['model']!r}: {e}") from None
        return self.backend

    def _ask(self, prompts: list[str]) -> list[str]:
        """The judge's replies to `prompts`, one batch; a backend error is retried `retries` times, then raised."""
        for attempt in range(self.retries + 1):
            try:
                self.stats["calls"] += len(prompts)
                gens = self._backend().generate(prompts, SamplingParams(max_new_tokens=self.max_tokens, temperature=0.0))
                return [g.text for g in gens]
            except BackendError as e:
                if attempt == self.retries:
                    raise JudgeError(f"judge: the grading model failed {self.retries + 1} time(s): {e}") from None
                self.stats["retried"] += len(prompts)
        raise AssertionError("unreachable")

    def grade(self, keys: list[tuple[str, str, tuple[str, ...]]]) -> dict[tuple[str, str, tuple[str, ...]], float]:
        """Grades of distinct (question, answer, references): asked, re-asked when unparseable, 0 after retries."""
        pending = list(dict.fromkeys(keys))
        got: dict[tuple[str, str, tuple[str, ...]], float] = {}
        for attempt in range(self.retries + 1):
            if not pending:
                break
            replies = self._ask([RUBRIC.format(question=q, reference=" | ".join(refs), answer=a)  # values are not
                                 for q, a, refs in pending])  # re-read as a format string: braces in them stay
            again = []
            for key, reply in zip(pending, replies, strict=True):
                score = parse_score(reply)
                if score is None:
                    again.append(key)
                else:
                    got[key] = score
            if again and attempt < self.retries:
                self.stats["retried"] += len(again)
            pending = again
        for key in pending:  # unparseable after every retry
            self.stats["unparseable"] += 1
            got[key] = 0.0
        return got

    def score(self, items: Sequence[Answered]) -> list[float]:
        keys = [(it.question, answer_text(it.reply), tuple(it.answers)) for it in items]
        for k in keys:
            if not k[1]:  # no answer written: 0 without asking
                self.cache[k] = 0.0
        missing = [k for k in dict.fromkeys(keys) if k not in self.cache]
        self.stats["cached"] += len(keys) - len(missing)
        if missing:
            for key, value in self.grade(missing).items():
                self.cache[key] = value
                while len(self.cache) > self.cache_size:
                    self.cache.popitem(last=False)
        out = []
        for k in keys:
            if k not in self.cache:  # evicted between grading and here (a batch larger than the cache)
                self.cache.update(self.grade([k]))
            out.append(self.cache[k])
        return out

    def metrics(self) -> dict[str, float]:
        """Counters since the start: judge calls, cached answers, unparseable replies (scored 0), retries."""
        return {f"reward/judge/{k}": float(v) for k, v in self.stats.items()}
