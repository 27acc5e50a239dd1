"""HTTP for the `openai` backend: the `openai` SDK's AsyncOpenAI on a background event-loop thread.

`Transport.call` is a coroutine of that loop: one request (a JSON body in, the decoded JSON reply out) to one
replica at a time, at most `max_concurrency` in flight across calls and replicas. Each try has one deadline over
all of it (connect, send, every byte of the reply). Retries are ours (the SDK's are off): 5xx, 429, timeouts and
connection errors are retried; with several replicas (memagent.backends.replicas) a failure rests that replica
and the request goes to another, and once it has failed on every one it can reach it waits the back-off
(exponential with jitter, at least a 429's Retry-After) for the next round, 1 + max_retries rounds in all.
A reply is read within bounds (`max_reply_bytes`, `memagent.bounded.MAX_DEPTH`, valid Unicode), and server text
is redacted as it comes in (`redact`: the key in any case or spacing, or a prefix of it, and every `Bearer`
token). Each fault and the error line it gets: docs/faults.md ("An OpenAI-compatible server", "A hostile server").
"""
from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
import weakref
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Coroutine

import openai

from memagent.backends.base import BackendError
from memagent.backends.redact import public_url, redact, redact_tree  # noqa: F401  (re-exported: the old place)
from memagent.backends.replicas import Router
from memagent.bounded import CONFIG_CHARS, loads_json

log = logging.getLogger(__name__)

try:  # the SDK's HTTP library (httpx2 in openai >= 3, httpx before)
    from httpx2 import AsyncByteStream as _ByteStream, Response as _Response, Timeout as _Timeout
except ImportError:  # pragma: no cover - older SDKs
    from httpx import (AsyncByteStream as _ByteStream, Response as _Response,  # type: ignore[assignment]
                       Timeout as _Timeout)

MAX_REPLY_BYTES = 32 << 20  # a reply of 32K tokens with log-probs is about 5 MB; an endless body stops here


# -- reading a reply within bounds ----------------------------------------------------------------------
class ReplyTooLarge(BackendError):
    """A reply body over the byte limit (raised while it is read; never retried)."""


class _CappedStream(_ByteStream):
    """A response body that raises ReplyTooLarge once more than `limit` bytes came."""

    def __init__(self, inner: Any, limit: int) -> None:
        self.inner, self.limit = inner, limit

    async def __aiter__(self) -> Any:
        n = 0
        async for block in self.inner:
            n += len(block)
            if n > self.limit:
                raise ReplyTooLarge(f"more than the {self.limit} bytes allowed (an endless or runaway body)")
            yield block

    async def aclose(self) -> None:
        await self.inner.aclose()


def _cap_reply(limit: int) -> Any:
    """An httpx response hook: refuse a declared Content-Length over `limit`, cap the body read at `limit`."""

    async def hook(response: Any) -> None:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise ReplyTooLarge(f"{declared} bytes by its Content-Length, more than the {limit} bytes allowed")
        response.stream = _CappedStream(response.stream, limit)

    return hook


_NOT_JSON = "\x00not JSON"  # the syntax message asked of loads_json: told apart from its other errors


def reply_json(data: bytes, where: str) -> Any:
    """The JSON value of a reply body, read by the project's bounded reader (memagent.bounded.loads_json:
    at most MAX_DEPTH levels, integers of bounded length, all text valid Unicode); a BackendError naming the
    server otherwise, NotJSON for a body that is not JSON at all."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BackendError(f"the server at {where} sent a reply that is not valid UTF-8 (byte {e.start}: "
                           f"{e.reason}); is it an OpenAI-compatible server (check --base-url)?") from None
    try:
        return loads_json(text, f"the reply of the server at {where}", BackendError, CONFIG_CHARS, syntax=_NOT_JSON)
    except BackendError as e:
        if str(e) == _NOT_JSON:
            raise NotJSON(where) from None
        raise


class NotJSON(BackendError):
    """A reply body that is not JSON (the caller says what it held)."""


def retryable(status: int) -> bool:
    """Server errors and rate limits are worth another try; other 4xx are the request's fault."""
    return status >= 500 or status == 429


def backoff_delay(attempt: int, base: float, cap: float, u: float) -> float:
    """Seconds to wait before retry `attempt` (1, 2, ...): base * 2^(attempt-1), jittered by the
    factor 0.5 + u (u uniform in [0, 1)) so that clients do not retry in lock-step, capped at `cap`."""
    return min(cap, base * 2 ** (attempt - 1) * (0.5 + u))


class Cancelled(BackendError):
    """A request stopped because another one of its batch failed (never the error reported)."""


class Batch:
    """Requests that stand or fall together: once one fails for good, the others are not sent."""

    failed = False


@dataclass
class _Failure:
    """A retryable failure of one try: kind is "unreachable", "connection broke", "timeout" or "HTTP"."""

    kind: str
    detail: str
    url: str
    retry_after: float | None = None


@dataclass
class Settings:
    """The client settings (see OpenAIBackend)."""

    timeout: float = 600.0
    connect_timeout: float = 10.0
    max_concurrency: int = 8
    max_retries: int = 4
    backoff: float = 1.0
    max_backoff: float = 30.0
    retry_seed: int | None = None
    max_reply_bytes: int = MAX_REPLY_BYTES


class Transport:
    """Requests to the replicas at `urls`, from any thread (`run`, `submit`) or on the loop (`call`).

    model / api_key_env: named in the errors (a 404, a refused key). key: the API key or None.
    """

    def __init__(self, urls: list[str], key: str | None, settings: Settings, *, model: str, api_key_env: str) -> None:
        self.urls, self.s, self.model, self.api_key_env = urls, settings, model, api_key_env
        self.has_key = bool(key)
        s = settings
        timeout = _Timeout(s.timeout, connect=min(s.connect_timeout, s.timeout))
        # no key: the SDK wants one, so it gets a placeholder and every request omits the header
        self._clients = [openai.AsyncOpenAI(base_url=u, api_key=key or "unused", max_retries=0, timeout=timeout,
                                            http_client=openai.DefaultAsyncHttpxClient(
                                                timeout=timeout, event_hooks={"response": [_cap_reply(
                                                    s.max_reply_bytes)]}))
                         for u in urls]
        self._headers = None if key else {"Authorization": openai.omit}
        self.router = Router(len(urls), s.backoff, s.max_backoff)
        self._rng = random.Random(s.retry_seed)
        self._loop = asyncio.new_event_loop()
        self._slots = asyncio.Semaphore(s.max_concurrency)
        self._thread = threading.Thread(target=self._loop.run_forever, name="memagent-openai", daemon=True)
        self._thread.start()
        self._finalizer = weakref.finalize(self, _stop, self._loop)  # a transport dropped without close() ends its thread

    def __repr__(self) -> str:
        return f"Transport(urls={public_url(','.join(self.urls))!r}, key={'set' if self.has_key else 'none'})"

    def submit(self, coro: Coroutine[Any, Any, Any]) -> "Future[Any]":
        """Run `coro` on the loop; its future (cancelling it cancels the coroutine)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.submit(coro).result()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._finalizer.detach()
        self.submit(_cancel_all()).result(timeout=10)  # callers waiting on a request get CancelledError
        for c in self._clients:
            self.submit(c.close()).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    # -- one request, its tries and rounds ---------------------------------------------------
    async def call(self, method: str, path: str, body: dict | None, *, batch: Batch | None = None,
                   allow_404: bool = False, replica: int | None = None, max_retries: int | None = None,
                   timeout: float | None = None) -> tuple[Any, str]:
        """(the decoded JSON reply or None on an allowed 404, the URL of the replica that answered);
        a BackendError once every round failed. `replica`: send to that one only; `max_retries` / `timeout`:
        instead of the settings' (a quick probe)."""
        others = set(range(len(self.urls))) - {replica} if replica is not None else set()
        tried = set(others)
        tries = rounds = 0
        retries = self.s.max_retries if max_retries is None else max_retries
        deadline = self.s.timeout if timeout is None else timeout
        last: _Failure | None = None
        while True:
            async with self._slots:
                _check(batch)
                i = self.router.pick(time.monotonic(), exclude=tried, probe=tried == others)
                if i is not None:
                    tried.add(i)
                    tries += 1
                    try:
                        got = await self._try(i, method, path, body, allow_404, batch, deadline)
                    except BackendError as e:
                        raise _counted(e, tries)
                    if not isinstance(got, _Failure):
                        return got, self.urls[i]
                    last = got
                    log.info("openai backend: %s %s from %s (try %d)", got.kind, got.detail, got.url, tries)
                    if rounds == retries and self.router.pick(time.monotonic(), exclude=tried) is None:
                        if batch is not None:
                            batch.failed = True  # before the slot is released: a queued request must see it
                        raise _counted(self._give_up(last, tries, deadline), tries)
                    continue
            rounds += 1
            if rounds > retries:
                raise _counted(self._give_up(last, tries, deadline), tries)
            delay = backoff_delay(rounds, self.s.backoff, self.s.max_backoff, self._rng.random())
            if last is not None and last.retry_after is not None:
                delay = max(delay, min(last.retry_after, self.s.max_backoff))
            await asyncio.sleep(delay)
            tried = set(others)

    async def _try(self, i: int, method: str, path: str, body: dict | None, allow_404: bool,
                   batch: Batch | None, deadline: float) -> Any:
        """One try on replica `i`: the reply's JSON, or a _Failure to retry; raises what must not be retried."""
        url = self.urls[i] + path
        self.router.start(i)
        ok, retry_after = True, None
        try:
            got = await self._send(i, method, path, body, url, allow_404, deadline)
            if isinstance(got, _Failure):
                ok, retry_after = False, got.retry_after
            return got
        except BaseException:
            if batch is not None:
                batch.failed = True  # before the slot is released: a queued request must see it
            raise
        finally:
            self.router.finish(i, time.monotonic(), ok=ok, retry_after=retry_after)

    async def _send(self, i: int, method: str, path: str, body: dict | None, url: str, allow_404: bool,
                    deadline: float) -> Any:
        client, opts = self._clients[i], {"headers": self._headers} if self._headers else {}
        try:
            send = client.post(path, cast_to=_Response, body=body, options=opts) if method == "POST" else \
                client.get(path, cast_to=_Response, options=opts)
            r = await asyncio.wait_for(send, deadline)  # the whole try, not each read
        except (asyncio.TimeoutError, openai.APITimeoutError) as e:
            return _Failure("timeout", f"{type(e).__name__} after {deadline:g} s", public_url(url))
        except ReplyTooLarge as e:
            raise self._too_large(e, url) from None
        except openai.APIStatusError as e:
            return self._status(e.response, url, allow_404)
        except openai.APIConnectionError as e:
            cause = e.__cause__ or e
            if isinstance(cause, ReplyTooLarge):
                raise self._too_large(cause, url) from None
            refused = "Connect" in type(cause).__name__
            what = f"{cause}" or type(cause).__name__
            return _Failure("unreachable" if refused else "connection broke", self.scrub(what), public_url(url))
        try:
            data = reply_json(r.content, public_url(url))
        except NotJSON:
            raise BackendError(f"the server at {public_url(url)} answered HTTP 200 with a body "
                               f"that is not JSON: {self._snippet(r)!r}") from None
        return redact_tree(data, self._key) if self._key else data

    def _too_large(self, e: ReplyTooLarge, url: str) -> BackendError:
        return BackendError(f"the server at {public_url(url)} sent a reply of {e}; not retried: check the "
                            "server, or --base-url")

    def _status(self, r: Any, url: str, allow_404: bool) -> Any:
        if r.status_code == 404 and allow_404:
            return None
        if not retryable(r.status_code):
            raise self._client_error(r, url)
        return _Failure("HTTP", f"{r.status_code}: {self._snippet(r)}", public_url(url), _retry_after(r))

    # -- errors ----------------------------------------------------------------------------
    @property
    def _key(self) -> str:
        return self._clients[0].api_key if self.has_key else ""

    def scrub(self, text: str) -> str:
        """`text` redacted of the key and of any Bearer token (memagent.backends.openai_http.redact)."""
        return redact(text, self._key)

    def _snippet(self, r: Any) -> str:
        """The message of an error body, redacted, then cut to 300 characters (and redacted again: the cut
        may leave a short piece of a token)."""
        try:
            text = r.text
            err = reply_json(r.content, "").get("error")
            text = err.get("message") if isinstance(err, dict) else str(err if err else text)
        except (BackendError, ValueError, AttributeError):
            pass
        return self.scrub(" ".join(self.scrub(str(text)).split())[:300])

    def _client_error(self, r: Any, url: str) -> BackendError:
        where, code, what = public_url(url), r.status_code, self._snippet(r)
        if code in (401, 403):
            held = (f"${self.api_key_env} holds a key the server does not accept" if self.has_key
                    else f"${self.api_key_env} is not set")
            return BackendError(f"the server at {where} refused the request (HTTP {code}: {what}); "
                                f"{held}: put the server's API key in ${self.api_key_env}")
        if code == 404:
            return BackendError(f"HTTP 404 from {where} ({what}): the model {self.model!r} is not served "
                                "there, or the base URL is wrong (it usually ends in /v1)")
        return BackendError(f"the server at {where} rejected the request (HTTP {code}: {what}); "
                            "not retried. A prompt may exceed the served context length, or a "
                            "parameter is not supported by this server")

    def _give_up(self, last: _Failure | None, tries: int, deadline: float) -> BackendError:
        assert last is not None
        where = last.url if len(self.urls) == 1 else f"{last.url} (last of {len(self.urls)} replicas)"
        if last.kind == "unreachable":
            return BackendError(f"the server at {where} is unreachable after {tries} tries "
                                f"({last.detail}): start it, or fix --base-url / OPENAI_BASE_URL")
        if last.kind == "connection broke":
            return BackendError(f"the connection to {where} broke during the request, {tries} tries "
                                f"({last.detail}): check the server's log, or retry with more max_retries")
        if last.kind == "timeout":
            return BackendError(f"no reply from {where} within {deadline:g} s, {tries} tries: the server "
                                "is overloaded or the generation is long; raise the timeout or lower "
                                "max_concurrency")
        return BackendError(f"the server at {where} failed all {tries} tries (last: HTTP {last.detail}); "
                            "check the server's log, or retry later with more max_retries")


def _counted(e: BackendError, tries: int) -> BackendError:
    """`e` with `attempts`: the tries its request made (read by the workflow's failure records)."""
    if getattr(e, "attempts", None) is None:
        e.attempts = tries  # type: ignore[attr-defined]
    return e


async def _cancel_all() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _stop(loop: asyncio.AbstractEventLoop) -> None:
    if not loop.is_closed():
        loop.call_soon_threadsafe(loop.stop)


def _check(batch: Batch | None) -> None:
    if batch is not None and batch.failed:
        raise Cancelled("cancelled: another request of the batch failed")


def _retry_after(r: Any) -> float | None:
    """Seconds from a Retry-After header given in seconds (the HTTP-date form is ignored)."""
    try:
        return max(0.0, float(r.headers.get("retry-after", "")))
    except ValueError:
        return None
