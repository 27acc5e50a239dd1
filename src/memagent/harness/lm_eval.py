"""MemAgent as an lm-evaluation-harness model, registered as `memagent` (run lm-eval's CLI with it registered:
`python -m memagent.harness.lm_eval_cli --model memagent --model_args model=DIR,prompt_split=line ...`).

- `generate_until`: each context is a one-message prompt (document, then question), split by the prompt rule
  and run through the read-write loop, all requests as one batch; the reply is cut at the first `until` string.
  The answer budget is the agent's `answer_tokens` (lm-eval's `max_gen_toks` is not the memory loop's).
- `loglikelihood`: the continuation's summed log-probs right after the answer prompt (the question and the
  final memory), and whether greedy decoding would write it (multiple-choice tasks, e.g. LongBench v2).
- `loglikelihood_rolling` (perplexity of a whole text) is refused: MemAgent reads a text into a memory, it has
  no likelihood of the text itself.
"""
from __future__ import annotations

from typing import Any

from memagent.harness import require

require("lm_eval")

from lm_eval.api.model import LM  # noqa: E402
from lm_eval.api.registry import register_model  # noqa: E402

from memagent.errors import InputError  # noqa: E402
from memagent.harness.runner import Harness  # noqa: E402


@register_model("memagent")
class MemAgentLM(LM):
    """`--model_args model=ID_OR_DIR` (or `pretrained=`), plus any of `memagent.harness.runner.ARGS`."""

    def __init__(self, model: str | None = None, pretrained: str | None = None, batch_size: Any = None,
                 max_batch_size: Any = None, device: str | None = None, **args: Any) -> None:
        super().__init__()
        name = model or pretrained
        if not name:
            raise InputError("the memagent lm-eval model needs --model_args model=<HF id or local directory>")
        if device is not None and "device" not in args:
            args["device"] = device
        if isinstance(batch_size, int) and batch_size > 0 and "batch_docs" not in args:
            args["batch_docs"] = batch_size
        self.harness = Harness(str(name), **args)
        self.timelines: list[dict[str, Any]] = []  # of the last generate_until call, in request order

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any], additional_config: dict[str, Any] | None = None) -> "MemAgentLM":
        """lm-eval's --batch_size/--device fill in what --model_args does not set (model_args win)."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in arg_dict}
        return cls(**arg_dict, **extra)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict[str, Any] | None = None) -> "MemAgentLM":
        from lm_eval.utils import simple_parse_args_string  # lazy: lm_eval

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        outcomes = self.harness.answer([req.args[0] for req in requests])
        self.timelines = [o.timeline for o in outcomes]
        return [_cut(o.text, (req.args[1] or {}).get("until")) for o, req in zip(outcomes, requests)]

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        return self.harness.loglikelihood([(req.args[0], req.args[1]) for req in requests])

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        raise InputError("loglikelihood_rolling (perplexity tasks such as wikitext) is not meaningful for MemAgent: "
                         "it reads a text into a fixed memory and has no likelihood of the text itself; run "
                         "generate_until or multiple-choice (loglikelihood) tasks")


def _cut(text: str, until: Any) -> str:
    """`text` up to the first of the `until` strings (lm-eval's stop sequences)."""
    stops = [until] if isinstance(until, str) else list(until or [])
    for s in stops:
        if s and s in text:
            text = text[: text.index(s)]
    return text
