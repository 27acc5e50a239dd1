"""What the job API and the chat API both check in a request: the server's limits (`ServeSettings`), the
questions, the document (an uploaded one's id, or text saved as a new document) and the job's own reading
workflow (a `workflow` field)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memagent.agent.registry import get_workflow, workflow_names
from memagent.split_prompt import SplitRule
from memagent.errors import MemAgentError
from memagent.serve.errors import ApiError
from memagent.serve.jobs import JobManager


@dataclass
class ServeSettings:
    """Limits and identity of one server."""

    model_name: str
    api_key: str | None = None  # None: no auth (loopback only)
    max_body_bytes: int = 16 << 20  # JSON requests (a document in a chat request included)
    max_question_chars: int = 8192
    max_questions: int = 32
    prompt_split: SplitRule = SplitRule("auto")  # where a one-message chat's question is (a body's prompt_split wins)
    wait_seconds: float = 0.5  # a waiting request wakes on each event, and at least this often (disconnects)


def check_questions(questions: Any, manager: JobManager, settings: ServeSettings) -> list[str]:
    """A non-empty list of non-empty questions within the length limits; 400 otherwise."""
    if not isinstance(questions, list) or not questions:
        raise ApiError(400, "missing question: give \"questions\": a non-empty list of strings")
    if len(questions) > settings.max_questions:
        raise ApiError(400, f"{len(questions)} questions, over the limit of {settings.max_questions} per job")
    tok, budget = manager.backend.tokenizer, manager.config.query_tokens
    for i, q in enumerate(questions):
        if not isinstance(q, str) or not q.strip():
            raise ApiError(400, f"questions[{i}] must be a non-empty string")
        if len(q) > settings.max_question_chars:
            raise ApiError(400, f"questions[{i}] has {len(q)} characters, over the limit of "
                                f"{settings.max_question_chars}; shorten it")
        n = len(tok(q, add_special_tokens=False)["input_ids"])
        if n > budget:
            raise ApiError(400, f"questions[{i}] has {n} tokens, over the question budget of {budget}; shorten it")
    return questions


def document_of(body: dict[str, Any], manager: JobManager) -> str:
    """The job's document id: `document_id` (checked), or `document` text saved as a new document."""
    if body.get("document_id") is not None:
        manager.docs.path(body["document_id"])
        return body["document_id"]
    text = body.get("document")
    if not isinstance(text, str):
        raise ApiError(400, "missing document: give \"document_id\" (from POST /v1/documents) or \"document\" (text)")
    return manager.docs.save_text(text)[0]


def workflow_of(body: dict[str, Any]) -> str | None:
    """The job's own `workflow` (a known name; 400 listing the valid ones otherwise), or None: the server's."""
    name = body.get("workflow")
    if name is None:
        return None
    if not isinstance(name, str):
        raise ApiError(400, f"workflow must be a name; valid workflows: {', '.join(workflow_names())}")
    try:
        get_workflow(name[:200])
    except MemAgentError as e:
        raise ApiError(400, str(e)) from None
    return name
