"""A third-party reading workflow, "echo": note what the first chunk says about the question (a call of its own
kind, "echo"), then answer from that note alone (the "final" call). Two calls per document; both are training
rows under Multi-Conv DAPO. Register it in a package's pyproject.toml:

    [project.entry-points."memagent.workflows"]
    echo = "echo_workflow:build"
"""
from dataclasses import dataclass, field
from typing import Any

from memagent.agent.answer import final_answer
from memagent.agent.chunking import iter_chunks
from memagent.agent.registry import (AgentResult, BudgetError, Call, Conversation, RunStats, check_questions,
                                     split_options)
from memagent.backends.base import SamplingParams

NOTE = "Question: {q}\nText: {text}\nNote what the text says about the question."
ANSWER = "Question: {q}\nNote: {note}\nAnswer with \\boxed{{}}."


@dataclass
class Doc:
    pos: int  # input position (the scheduler's)
    item: Any  # the AgentInput
    head: str  # the document's first chunk
    note: str = ""
    calls: int = 0  # model calls so far (the scheduler counts them)
    conversations: list = field(default_factory=list)


class Echo:
    name = "echo"

    def __init__(self, backend: Any, config: Any, **options: Any) -> None:
        self.backend, self.config, self.stats = backend, config, RunStats()
        self.options, _ = split_options(options)  # no options of its own

    def check_budget(self, items: list) -> None:
        check_questions(self.backend, self.config, items)
        cfg, window = self.config, self.backend.max_window
        need = self.backend.prompt_length(NOTE.format(q="", text="")) + cfg.query_tokens + cfg.chunk_tokens \
            + 2 * cfg.answer_tokens
        if window is not None and need > window:
            raise BudgetError(f"an echo call needs {need} tokens, the window is {window}; lower --chunk-tokens")

    def start(self, pos: int, item: Any) -> Doc:
        first = next(iter_chunks(item.document, self.backend.tokenizer, self.config.chunk_tokens), None)
        return Doc(pos, item, first.text if first else "")

    def next_call(self, d: Doc) -> Call:
        if d.calls == 0:
            return Call("echo", NOTE.format(q=d.item.question, text=d.head), self.config.answer_tokens)
        return Call("final", ANSWER.format(q=d.item.question, note=d.note), self.config.answer_tokens)

    def params(self, max_new_tokens: int, seed: int | None) -> SamplingParams:
        return SamplingParams(max_new_tokens, self.config.temperature, self.config.top_p, seed)

    def take(self, d: Doc, call: Call, gen: Any, seconds: float, batch_size: int) -> AgentResult | None:
        if self.options.keep_conversations:
            d.conversations.append(Conversation(call.kind, 0, call.prompt, gen.prompt_token_ids, gen.token_ids,
                                                gen.logprobs, gen.text))
        record = dict(doc_id=d.item.doc_id, step=0, kind=call.kind, prompt_tokens=self.backend.prompt_length(
            call.prompt), generated_tokens=len(gen.token_ids), seconds=round(seconds, 6), batch_size=batch_size)
        if call.kind == "echo":
            d.note = gen.text.strip()
            self.options.emit(dict(record, text=d.note))  # a trace record, and on_step (serve's events)
            return None
        answer, _ = final_answer(gen.text, self.config.answer_protocol, self.config.think)
        self.options.emit(dict(record, answer=answer, raw_answer=gen.text))
        return AgentResult(d.item.doc_id, d.item.question, answer, gen.text, d.note, 1, d.conversations,
                           calls=d.calls)

    def fail(self, d: Any, exc: BaseException) -> AgentResult:
        return AgentResult(d.item.doc_id, d.item.question, None, "", "", 0,
                           error=dict(kind=type(exc).__name__, message=str(exc), attempts=1))


def build(backend: Any, config: Any, **options: Any) -> Echo:
    """The entry point's factory: (backend, AgentConfig, **options) -> a Workflow."""
    return Echo(backend, config, **options)
