"""The boundary between memagent and a third party's workflow (a plug-in: defined outside the memagent package).

What a plug-in raises is its fault, not memagent's: it becomes a `WorkflowError` that names the plug-in and its
module (`plugin_fault`), failing the document it was reading while the others go on (the scheduler records it as
any failed document). What it yields and returns is checked before memagent acts on it: a sound `Call`
(`check_call`) whose prompt and new tokens fit the backend's window (`check_call_fits`, counted before it is
sent: its declared window is not trusted), a sound `Answer` (`check_answer`). A state machine of the earlier
protocol is wrapped whole (`GuardedSteps`). memagent.agent.runner and memagent.agent.registry use these; the
per-document call cap is the runner's (WorkflowOptions.max_calls), for every workflow.
"""
from __future__ import annotations

import logging
from typing import Any

from memagent.agent.protocol import (MAX_CALLS_PER_CHUNK, MAX_CALLS_SLACK, AgentResult, Answer, BudgetError, Call,
                                     WorkflowError, WorkflowOptions)
from memagent.errors import MemAgentError
from memagent.plugins import is_plugin, short_error  # is_plugin: memagent.agent.runner imports it from here

log = logging.getLogger(__name__)


def plugin_fault(name: str, workflow: Any, what: str, exc: BaseException) -> WorkflowError:
    """The WorkflowError of a plug-in that raised `exc` while doing `what`: names it and its module."""
    return WorkflowError(f"workflow {name} (a plug-in, module {getattr(workflow, '__module__', '?')}) failed {what}: "
                         f"{short_error(exc)}; this is a fault of the "
                         "plug-in, not of memagent: report it to its authors or choose another --workflow")


def close_quietly(gen: Any) -> None:
    """Close a workflow's generator (its finally blocks run); what a broken one raises then is logged, not raised."""
    try:
        gen.close()
    except Exception as e:  # noqa: BLE001 - the document has failed already
        log.warning("closing a workflow's generator raised %s: %s", type(e).__name__, str(e)[:200])


def check_call(name: str, call: Any, doc_id: str, how: str = "yield") -> None:
    """WorkflowError for a yield (`how`: or "return from next_call") that is not a sound Call: kind a non-empty
    string, prompt a string, max_new_tokens a positive integer, step an integer."""
    if not isinstance(call, Call):
        raise WorkflowError(f"workflow {name} must {how} a Call, got {type(call).__name__} (document {doc_id})")
    bad = [f"kind {call.kind!r}" if not isinstance(call.kind, str) or not call.kind else "",
           f"prompt of type {type(call.prompt).__name__}" if not isinstance(call.prompt, str) else "",
           f"max_new_tokens {call.max_new_tokens!r}" if not isinstance(call.max_new_tokens, int)
           or isinstance(call.max_new_tokens, bool) or call.max_new_tokens < 1 else "",
           f"step {call.step!r}" if not isinstance(call.step, int) or isinstance(call.step, bool) else ""]
    if any(bad):
        raise WorkflowError(f"workflow {name} yielded a Call with {', '.join(b for b in bad if b)[:300]} (document "
                            f"{doc_id}); a call needs a kind (text), a prompt (text), max_new_tokens >= 1, an "
                            "integer step")


def _field_problems(x: Any) -> str:
    """What is wrong with an Answer's or AgentResult's fields ("" when nothing): answer text or None, raw_answer and
    memory text, num_chunks an integer."""
    bad = [f"answer of type {type(x.answer).__name__}" if not isinstance(x.answer, (str, type(None))) else "",
           f"raw_answer of type {type(x.raw_answer).__name__}" if not isinstance(x.raw_answer, str) else "",
           f"memory of type {type(x.memory).__name__}" if not isinstance(x.memory, str) else "",
           f"num_chunks {x.num_chunks!r}" if not isinstance(x.num_chunks, int) or isinstance(x.num_chunks, bool)
           else ""]
    return ", ".join(b for b in bad if b)[:300]


def check_answer(name: str, answer: Any, doc_id: str) -> None:
    """WorkflowError for a return that is not a sound Answer: answer text or None, raw_answer and memory text,
    num_chunks an integer."""
    if not isinstance(answer, Answer):
        raise WorkflowError(f"workflow {name} must return an Answer, got {type(answer).__name__} (document {doc_id})")
    bad = _field_problems(answer)
    if bad:
        raise WorkflowError(f"workflow {name} returned an Answer with {bad} "
                            f"(document {doc_id}); answer must be text or None, raw_answer and memory text")


def check_result(name: str, result: Any, doc_id: str) -> None:
    """WorkflowError for what a state machine of the earlier protocol returned from `take` when it is not a sound
    AgentResult (None means "not finished" and is not checked here): answer text or None, raw_answer and memory
    text, num_chunks an integer."""
    if not isinstance(result, AgentResult):
        raise WorkflowError(f"workflow {name} must return an AgentResult (or None) from take, got "
                            f"{type(result).__name__} (document {doc_id})")
    bad = _field_problems(result)
    if bad:
        raise WorkflowError(f"workflow {name} returned an AgentResult with {bad} "
                            f"(document {doc_id}); answer must be text or None, raw_answer and memory text")


def check_call_fits(backend: Any, call: Call, name: str, doc_id: str) -> None:
    """BudgetError, before it is sent, for a call whose prompt and new tokens do not fit the backend's window (a
    plug-in's calls: the window it declared is not trusted). The prompt is counted in pieces of a few times the
    window in characters, stopping as soon as it is over: a prompt of any length costs O(window) to refuse."""
    window = backend.max_window
    if window is None:
        return
    budget = window - call.max_new_tokens
    over = f"workflow {name} asked for a call of kind {call.kind!r} (document {doc_id}) with "
    if budget < 1:
        raise BudgetError(f"{over}{call.max_new_tokens} new tokens, over the model's window of {window}")
    piece, n, pieces = 8 * window, 0, 0
    long = len(call.prompt) > piece  # a short prompt gets the exact count only
    for at in range(0, len(call.prompt) if long else 0, piece):  # pieces: at most one token more each than whole
        n += len(backend.tokenizer(call.prompt[at:at + piece], add_special_tokens=False)["input_ids"])
        pieces += 1
        if n - pieces > budget:
            raise BudgetError(f"{over}over {n - pieces} prompt tokens + {call.max_new_tokens} new tokens, over the "
                              f"model's window of {window}; nothing was sent")
    need = backend.prompt_length(call.prompt)  # the exact count, chat template included
    if need > budget:
        raise BudgetError(f"{over}{need} prompt tokens + {call.max_new_tokens} new tokens, over the model's "
                          f"window of {window}; nothing was sent")


def _doc_id(doc: Any) -> str:
    item = getattr(doc, "item", None)
    return str(getattr(item, "doc_id", None) or getattr(doc, "doc_id", None) or getattr(doc, "pos", "?"))


class GuardedSteps:
    """A plug-in's state machine of the earlier protocol, under the checks a generator workflow gets (issue 48,
    class 8): whatever its methods raise (not a MemAgentError) turned into a WorkflowError naming it; each call it
    chooses checked as a yielded call is (`check_call`, the per-document call cap of the run options, the prompt
    counted against the backend's window: `check_call_fits`) and each result as a returned answer is
    (`check_result`). The next call is chosen as soon as a document starts or takes a reply, so a bad call fails
    that document only (the scheduler records a failure in `start` or `take`); a fault in `check_budget` or `fail`
    stops the run with one error line. Every other attribute is the machine's own."""

    def __init__(self, wf: Any, name: str, target: Any, backend: Any = None) -> None:
        self.__dict__.update(_wf=wf, _name=name, _target=target, _backend=backend, _calls={}, _next={})

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.__dict__["_wf"], attr)

    def _guard(self, what: str, method: str, *args: Any) -> Any:
        try:
            return getattr(self._wf, method)(*args)
        except MemAgentError:
            raise
        except Exception as e:  # noqa: BLE001 - the plug-in's fault
            raise plugin_fault(self._name, self._target, what, e) from None

    def _cap(self, doc: Any) -> tuple[int, str]:
        """(the most calls `doc` may make, the rule) from the machine's run options (WorkflowOptions)."""
        options = getattr(self._wf, "options", None)
        if not isinstance(options, WorkflowOptions):
            options = WorkflowOptions()
        chunks = getattr(doc, "num_chunks", 0)
        chunks = chunks if isinstance(chunks, int) and not isinstance(chunks, bool) and chunks >= 0 else 0
        rule = "max_calls" if options.max_calls else \
            f"{MAX_CALLS_PER_CHUNK} per chunk read ({chunks}) + {MAX_CALLS_SLACK}"
        return options.call_cap(chunks), rule

    def _choose(self, doc: Any) -> Call:
        """The machine's next call for `doc`, checked (class docstring)."""
        call = self._guard("choosing its next call", "next_call", doc)
        doc_id = _doc_id(doc)
        check_call(self._name, call, doc_id, "return from next_call")
        n = self._calls.get(id(doc), 0) + 1
        self._calls[id(doc)] = n
        cap, rule = self._cap(doc)
        if n > cap:
            raise WorkflowError(f"workflow {self._name} asked for call {n} of document {doc_id}, over its cap of "
                                f"{cap} calls ({rule}); a workflow that never finishes is stopped here (raise the "
                                "run option max_calls if it needs more)")
        if self._backend is not None:
            check_call_fits(self._backend, call, self._name, doc_id)
        return call

    def _done(self, doc: Any) -> None:
        self._calls.pop(id(doc), None)
        self._next.pop(id(doc), None)

    def check_budget(self, items: Any) -> None:
        self._guard("checking its budget", "check_budget", items)

    def start(self, pos: int, item: Any) -> Any:
        doc = self._guard(f"starting document {getattr(item, 'doc_id', pos)}", "start", pos, item)
        try:
            self._next[id(doc)] = self._choose(doc)
        except BaseException:
            self._done(doc)
            raise
        return doc

    def next_call(self, doc: Any) -> Any:
        call = self._next.pop(id(doc), None)
        return call if call is not None else self._choose(doc)

    def take(self, doc: Any, *args: Any) -> Any:
        try:
            result = self._guard("taking a reply", "take", doc, *args)
            if result is None:
                self._next[id(doc)] = self._choose(doc)
                return None
            check_result(self._name, result, _doc_id(doc))
        except BaseException:
            self._done(doc)
            raise
        self._done(doc)
        return result

    def fail(self, doc: Any, exc: BaseException) -> Any:
        self._done(doc)
        return self._guard("failing a document", "fail", doc, exc)

    def params(self, *args: Any) -> Any:
        return self._guard("choosing its sampling", "params", *args)
