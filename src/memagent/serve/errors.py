"""The service's error (an HTTP status, a message saying what is wrong and what to do, and a type), and the
signal that stops a cancelled job."""
from __future__ import annotations

from memagent.errors import MemAgentError


class ApiError(MemAgentError):
    """A request the service refuses; sent as `{"error": {"message", "type"}}` with `status`."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.headers = headers or {}


class JobCancelled(Exception):
    """Raised inside a job's thread to stop it (DELETE, or the client went away)."""
