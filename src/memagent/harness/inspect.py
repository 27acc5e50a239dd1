"""MemAgent as an Inspect AI model API: `inspect eval TASK --model memagent/<HF id or local dir> -M k=v ...`
(registered through the `inspect_ai` entry point in pyproject; -M takes `memagent.harness.runner.ARGS`).

Each sample's input (one user message holding document and question, or the document in earlier messages and
the question last) runs the whole read-write loop in process; the reply is the answer, and the memory timeline
(memories, chunk offsets, evidence, calls, tokens) goes into the sample's metadata (`memagent`) and the
model output's metadata, where Inspect's log viewer shows it.
"""
from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any

from memagent.harness import require

require("inspect_ai")

from inspect_ai.model import ChatMessage, GenerateConfig, ModelAPI, ModelOutput, ModelUsage, modelapi  # noqa: E402
from inspect_ai.tool import ToolChoice, ToolInfo  # noqa: E402

from memagent.split_prompt import SplitRule  # noqa: E402
from memagent.cli import fail  # noqa: E402
from memagent.harness.runner import Harness, reply_text  # noqa: E402


class MemAgentAPI(ModelAPI):
    """One Harness per model; samples run one at a time on a local model (its generate is not reentrant)."""

    def __init__(self, model_name: str, base_url: str | None = None, api_key: str | None = None,
                 config: GenerateConfig = GenerateConfig(), **model_args: Any) -> None:
        super().__init__(model_name, base_url, api_key, [], config)
        try:
            self.harness = Harness(model_name, **model_args)
        except Exception as e:  # noqa: BLE001
            if "inspect_ai._cli.main" not in sys.modules:  # Inspect's Python API: the caller handles it
                raise
            fail(e)  # `inspect eval ... -M bad=1`: one `error:` line, exit 2, as `memagent` itself
        self._lock = threading.Lock()

    def max_connections(self) -> int:
        return 1

    async def generate(self, input: list[ChatMessage], tools: list[ToolInfo], tool_choice: ToolChoice,
                       config: GenerateConfig) -> ModelOutput:
        return await asyncio.to_thread(self._generate, [(m.role, m.text) for m in input])

    def _generate(self, messages: list[tuple[str, str]]) -> ModelOutput:
        last = max((i for i, (role, _) in enumerate(messages) if role == "user"), default=None)
        if last is None:
            raise ValueError("memagent: the sample has no user message (the question)")
        before = [text for _, text in messages[:last] if text.strip()]
        rule = self.harness.rule
        if rule.kind == "messages" or (rule.kind == "auto" and before):  # the document came separately
            pairs, rule = [("\n\n".join(before), messages[last][1])], SplitRule("messages")
        else:
            head, question = self.harness.split(messages[last][1])
            pairs = [("\n\n".join(before + [head]), question)]
        with self._lock:
            result, timeline = self.harness.run(pairs)[0]
        timeline["prompt_split"] = str(rule)
        _to_sample_metadata(timeline)
        out = ModelOutput.from_content(model=self.model_name, content=reply_text(result))
        out.usage = ModelUsage(input_tokens=timeline["prompt_tokens"], output_tokens=timeline["completion_tokens"],
                               total_tokens=timeline["prompt_tokens"] + timeline["completion_tokens"])
        out.metadata = {"memagent": timeline}
        return out


def _to_sample_metadata(timeline: dict[str, Any]) -> None:
    """Put the timeline in the running sample's metadata (Inspect keeps no public setter for it)."""
    try:
        from inspect_ai.solver._task_state import sample_state  # lazy: inspect_ai
    except ImportError:
        return
    state = sample_state()
    if state is not None:
        state.metadata["memagent"] = timeline


@modelapi(name="memagent")
def memagent() -> type[ModelAPI]:
    return MemAgentAPI
