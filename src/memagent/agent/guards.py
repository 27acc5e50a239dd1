"""The boundary between memagent and a third party's workflow (a plug-in: defined outside the memagent package).

What a plug-in raises is its fault, not memagent's: it becomes a `WorkflowError` that names the plug-in and its
module (`plugin_fault`), failing the document it was reading while the others go on (the scheduler records it as
any failed document). What it yields and returns is checked before memagent acts on it: a sound `Call`
(`check_call`) whose prompt and new tokens fit the backend's window (`check_call_fits`, counted before it is
sent: its declared window is not trusted), a sound `Answer` (`check_answer`). memagent.agent.runner uses these;
the per-document call cap is the runner's (WorkflowOptions.max_calls), for every workflow.
"""
from __future__ import annotations

import logging
from typing import Any

from memagent.agent.protocol import Answer, BudgetError, Call, WorkflowError
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
