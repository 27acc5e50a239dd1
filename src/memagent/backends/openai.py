"""The `openai` backend: any OpenAI-compatible HTTP server (vLLM, SGLang, llama.cpp's server).

One request per prompt (chat completions, or plain completions with `use_chat=False`), at most
`max_concurrency` in flight, results in input order. Every try of a request has a deadline that
bounds all of it (connect, send, every byte of the reply; memagent.backends.deadline), not each
read; 5xx, 429, timeouts and connection errors are retried up to `max_retries` times with
exponential back-off and jitter (a 429's Retry-After is honoured); other 4xx fail at once. After the last try the
error says what happened (status, URL without credentials, number of tries) and what to do.
The API key is read from the environment and never printed. Every reply is type-checked
(memagent.backends.openai_reply): a malformed one is a BackendError naming the field and the server.

Chunking and budgets need the served model's tokenizer, which an HTTP server does not expose:
it is named separately (a Hugging Face id or a local directory). `prompt_length` renders the
prompt with that tokenizer's chat template, as the server does.

Token ids and log-probs. The OpenAI API returns text. Exact token ids come back only when the
server offers them: vLLM >= 0.10.2 with `return_token_ids`, or older vLLM's
`return_tokens_as_token_ids` (log-prob tokens spelt "token_id:N"); `request_token_ids=True`
asks for both (other servers may reject the unknown fields). Otherwise the reply text is
re-tokenised (plus the EOS id when the server stopped), which can differ from the sampled ids;
then log-probs are kept only when their count matches, and dropped with a warning when not.
Departure to know about for training: what a server's log-probs mean varies (vLLM by default
returns those of the raw model, before temperature); the trainer recomputes its own.
"""
from __future__ import annotations

import logging
import math
import os
import random
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, Sequence
from urllib.parse import urlsplit, urlunsplit

import httpx

from memagent.backends.base import BackendError, Generation, SamplingParams
from memagent.backends.chat import encode_prompt, resolve_chat_template
from memagent.backends.deadline import DeadlineTransport, deadline
from memagent.backends.openai_reply import parse_choice, prompt_tokens, served_models
from memagent.backends.tokenizer import load_tokenizer

log = logging.getLogger(__name__)


def public_url(url: str) -> str:
    """`url` without user:password@ and without a query string, safe to print."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def retryable(status: int) -> bool:
    """Server errors and rate limits are worth another try; other 4xx are the request's fault."""
    return status >= 500 or status == 429


def backoff_delay(attempt: int, base: float, cap: float, u: float) -> float:
    """Seconds to wait before retry `attempt` (1, 2, ...): base * 2^(attempt-1), jittered by the
    factor 0.5 + u (u uniform in [0, 1)) so that clients do not retry in lock-step, capped at `cap`."""
    return min(cap, base * 2 ** (attempt - 1) * (0.5 + u))


def _config_window(tokenizer: Any) -> int | None:
    """max_position_embeddings of the model config next to the tokenizer, when there is one."""
    name = getattr(tokenizer, "name_or_path", None)
    if not name:
        return None
    try:
        from transformers import AutoConfig

        return getattr(AutoConfig.from_pretrained(name), "max_position_embeddings", None)
    except Exception:  # noqa: BLE001 - the window is optional information
        return None


class OpenAIBackend:
    """Backend over an OpenAI-compatible server.

    model: the served model's name (as the server lists it in /v1/models).
    base_url: e.g. http://localhost:8000/v1; default $OPENAI_BASE_URL.
    tokenizer: HF id, local directory or tokenizer object for chunking; default the model name.
    api_key_env: environment variable holding the key (sent as a Bearer token; optional).
    max_concurrency: requests in flight at once, across all calls of this backend.
    timeout: seconds one try of a request may take in all, from connecting to the reply's last byte
        (a reply takes as long as its whole generation).
    max_retries / backoff / max_backoff / retry_seed: retries after the first try, the first
        back-off in seconds (doubling, jittered), its cap, and the jitter's seed.
    use_chat: chat-completions endpoint (the server applies the chat template) or completions.
    want_logprobs / request_token_ids: see the module docstring.
    max_window: the model's context length; default the server's max_model_len, else the config
        next to the tokenizer, else None.
    check_server: ask /models at construction, so a wrong URL or model fails before any work.
    extra_body: extra JSON fields for every generation request (e.g. {"top_k": 20}).
    chat_template_kwargs: variables for the server's chat template (e.g. {"enable_thinking": False}),
        sent as the request's `chat_template_kwargs` and used for local prompt lengths too.
    """

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        tokenizer: Any = None,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        max_concurrency: int = 8,
        timeout: float = 600.0,  # long generations under load take minutes
        connect_timeout: float = 10.0,
        max_retries: int = 4,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        retry_seed: int | None = None,
        use_chat: bool = True,
        want_logprobs: bool = False,
        request_token_ids: bool = False,
        max_window: int | None = None,
        check_server: bool = True,
        extra_body: dict[str, Any] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        url = _checked_url(base_url, max_concurrency, timeout, connect_timeout, max_retries)
        self.model = model
        self.base_url = url.rstrip("/")
        self.api_key_env = api_key_env
        self.max_concurrency = max_concurrency
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff, self.max_backoff = backoff, max_backoff
        self.use_chat = use_chat
        self.want_logprobs = want_logprobs
        self.request_token_ids = request_token_ids
        self.extra_body = dict(extra_body or {})
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        if self.chat_template_kwargs and use_chat:
            self.extra_body["chat_template_kwargs"] = {**self.extra_body.get("chat_template_kwargs", {}),
                                                       **self.chat_template_kwargs}
        self._rng = random.Random(retry_seed)
        self._rng_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._notes: set[str] = set()
        self._client = _client(os.environ.get(api_key_env) or None, max_concurrency, timeout, connect_timeout)
        self.tokenizer = load_tokenizer(tokenizer, model)
        self.use_chat_template = use_chat and resolve_chat_template(self.tokenizer, "auto")
        if use_chat and not self.use_chat_template:
            log.warning("openai backend: the tokenizer has no chat template, so prompt lengths are "
                        "counted without the server's template (budgets may be a little short)")
        served_window = self.check_model() if check_server else None
        self.max_window = max_window or served_window or _config_window(self.tokenizer)

    def __repr__(self) -> str:
        key = f"${self.api_key_env}" if self._has_key else "none"
        return (f"OpenAIBackend(model={self.model!r}, base_url={public_url(self.base_url)!r}, "
                f"api_key={key}, max_concurrency={self.max_concurrency}, use_chat={self.use_chat})")

    @property
    def _has_key(self) -> bool:
        return "authorization" in self._client.headers

    def close(self) -> None:
        self._client.close()

    # -- prompts ---------------------------------------------------------------------------
    def encode(self, prompt: str) -> list[int]:
        """The prompt's ids as the server renders it (chat template of the same tokenizer)."""
        return encode_prompt(self.tokenizer, prompt, self.use_chat_template, self.chat_template_kwargs)

    def prompt_length(self, prompt: str) -> int:
        return len(self.encode(prompt))

    # -- the server ------------------------------------------------------------------------
    def check_model(self) -> int | None:
        """GET /models: fail now on a wrong URL or model; return the served max_model_len."""
        listing = self._request("GET", "/models", None, allow_404=True)
        if listing is None:  # some servers have no /models; generation will tell
            return None
        served = served_models(listing, public_url(self.base_url + "/models"))
        ids = [m["id"] for m in served]
        if served and self.model not in ids:
            raise BackendError(f"the server at {public_url(self.base_url)} does not serve model "
                               f"{self.model!r}; it serves: {', '.join(map(str, ids))}. Pass one as --model")
        window = next((m.get("max_model_len") for m in served if m.get("id") == self.model), None)
        return window

    def _body(self, prompt: str, params: SamplingParams, index: int) -> dict[str, Any]:
        body: dict[str, Any] = dict(model=self.model, max_tokens=params.max_new_tokens,
                                    temperature=params.temperature, top_p=params.top_p, n=1, stream=False)
        if self.use_chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if params.seed is not None:
            body["seed"] = params.seed + index  # one seed per request: equal prompts, different samples
        if self.want_logprobs:
            body["logprobs"] = True if self.use_chat else 1
        if self.request_token_ids:
            body["return_token_ids"] = True
            if self.want_logprobs:
                body["return_tokens_as_token_ids"] = True
        body.update(self.extra_body)
        return body

    def generate(self, prompts: Sequence[str], params: SamplingParams) -> list[Generation]:
        path = "/chat/completions" if self.use_chat else "/completions"
        replies = self._post_all(path, [self._body(p, params, i) for i, p in enumerate(prompts)])
        out, where = [], public_url(self.base_url + path)
        for prompt, data in zip(prompts, replies):  # tokenizers are not shared across threads
            gen, note = parse_choice(data, chat=self.use_chat, tokenizer=self.tokenizer,
                                     want_logprobs=self.want_logprobs, where=where)
            if note and note not in self._notes:
                self._notes.add(note)
                log.warning("openai backend: %s", note)
            if gen.prompt_token_ids is None:
                local = self.encode(prompt)
                if prompt_tokens(data, where) == len(local):
                    gen.prompt_token_ids = local  # the server counted as many: same rendering
            out.append(gen)
        return out

    def _post_all(self, path: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """POST every body, at most max_concurrency at once; replies in order. The first failure
        cancels the rest (queued requests are never sent, running ones stop retrying)."""
        if not bodies:
            return []
        cancel = threading.Event()
        workers = min(self.max_concurrency, len(bodies))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="memagent-openai") as pool:
            futures = [pool.submit(self._request_or_cancel, path, b, cancel) for b in bodies]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in futures if f in done and f.exception() is not None]
            failed.sort(key=lambda f: isinstance(f.exception(), _Cancelled))  # the cause first
            if failed:
                cancel.set()
                for f in futures:
                    f.cancel()
                raise failed[0].exception()
            return [f.result() for f in futures]

    def _request_or_cancel(self, path: str, body: dict[str, Any], cancel: threading.Event) -> Any:
        try:
            return self._request("POST", path, body, cancel=cancel)
        except BaseException:
            cancel.set()  # set here, not in the caller: a worker may pick the next request at once
            raise

    def _request(self, method: str, path: str, body: dict | None, *, cancel: threading.Event | None = None,
                 allow_404: bool = False) -> Any:
        """One HTTP call with retries; returns the decoded JSON (None on a 404 when allowed)."""
        url = self.base_url + path
        tries = 1 + self.max_retries
        failure, retry_after = "", None
        cancel = cancel or threading.Event()
        for attempt in range(tries):
            if cancel.is_set():
                raise _Cancelled("cancelled: another request of the batch failed")
            if attempt:
                with self._rng_lock:
                    u = self._rng.random()
                delay = backoff_delay(attempt, self.backoff, self.max_backoff, u)
                if retry_after is not None:
                    delay = max(delay, min(retry_after, self.max_backoff))
                if cancel.wait(delay):
                    raise _Cancelled("cancelled: another request of the batch failed")
            retry_after = None
            try:
                with self._slots, deadline(self.timeout):  # the whole try, not each read
                    r = self._client.request(method, url, json=body)
            except httpx.TimeoutException as e:
                failure = f"timeout: {type(e).__name__} after {self.timeout:g} s"
                log.info("openai backend: %s from %s (try %d of %d)", failure, public_url(url), attempt + 1, tries)
                continue
            except httpx.TransportError as e:
                what = "unreachable" if isinstance(e, httpx.ConnectError) else "connection broke"
                failure = f"{what}: {self._scrub(str(e)) or type(e).__name__}"
                log.info("openai backend: %s (try %d of %d)", failure, attempt + 1, tries)
                continue
            if r.status_code == 200:
                try:
                    return r.json()
                except ValueError:
                    raise BackendError(f"the server at {public_url(url)} answered HTTP 200 with a body "
                                       f"that is not JSON: {self._snippet(r)!r}") from None
            if r.status_code == 404 and allow_404:
                return None
            if not retryable(r.status_code):
                raise self._client_error(r, url)
            failure = f"HTTP {r.status_code}: {self._snippet(r)}"
            retry_after = _retry_after(r)
            log.info("openai backend: %s from %s (try %d of %d)", failure, public_url(url), attempt + 1, tries)
        raise self._give_up(failure, url, tries)

    # -- errors ----------------------------------------------------------------------------
    def _scrub(self, text: str) -> str:
        auth = self._client.headers.get("authorization", "")
        key = auth[len("Bearer "):] if auth.startswith("Bearer ") else ""
        return text.replace(key, "***") if key else text

    def _snippet(self, r: httpx.Response) -> str:
        try:
            err = r.json().get("error")
            text = err.get("message") if isinstance(err, dict) else str(err if err else r.text)
        except (ValueError, AttributeError):
            text = r.text
        return self._scrub(" ".join(str(text).split())[:300])

    def _client_error(self, r: httpx.Response, url: str) -> BackendError:
        where, code, what = public_url(url), r.status_code, self._snippet(r)
        if code in (401, 403):
            held = (f"${self.api_key_env} holds a key the server does not accept" if self._has_key
                    else f"${self.api_key_env} is not set")
            return BackendError(f"the server at {where} refused the request (HTTP {code}: {what}); "
                                f"{held}: put the server's API key in ${self.api_key_env}")
        if code == 404:
            return BackendError(f"HTTP 404 from {where} ({what}): the model {self.model!r} is not served "
                                "there, or the base URL is wrong (it usually ends in /v1)")
        return BackendError(f"the server at {where} rejected the request (HTTP {code}: {what}); "
                            "not retried. A prompt may exceed the served context length, or a "
                            "parameter is not supported by this server")

    def _give_up(self, failure: str, url: str, tries: int) -> BackendError:
        where = public_url(url)
        if failure.startswith("unreachable"):
            return BackendError(f"the server at {where} is unreachable after {tries} tries "
                                f"({failure.split(': ', 1)[1]}): start it, or fix --base-url / OPENAI_BASE_URL")
        if failure.startswith("connection broke"):
            return BackendError(f"the connection to {where} broke during the request, {tries} tries "
                                f"({failure.split(': ', 1)[1]}): check the server's log, or retry with more max_retries")
        if failure.startswith("timeout"):
            return BackendError(f"no reply from {where} within {self.timeout:g} s, {tries} tries: the server "
                                "is overloaded or the generation is long; raise the timeout or lower "
                                "max_concurrency")
        return BackendError(f"the server at {where} failed all {tries} tries (last: {failure}); "
                            "check the server's log, or retry later with more max_retries")


class _Cancelled(BackendError):
    """A request stopped because another one of its batch failed (never the error reported)."""


def _retry_after(r: httpx.Response) -> float | None:
    """Seconds from a Retry-After header given in seconds (the HTTP-date form is ignored)."""
    try:
        return max(0.0, float(r.headers.get("retry-after", "")))
    except ValueError:
        return None


def _checked_url(base_url: str | None, max_concurrency: int, timeout: float, connect_timeout: float,
                 max_retries: int) -> str:
    """The server's URL (`base_url`, else $OPENAI_BASE_URL) once the client settings are checked."""
    if max_concurrency < 1:
        raise BackendError(f"max_concurrency must be at least 1, got {max_concurrency}")
    if not (math.isfinite(timeout) and math.isfinite(connect_timeout)) or timeout <= 0 or connect_timeout <= 0:
        raise BackendError(f"timeouts must be positive, got timeout={timeout}, connect_timeout={connect_timeout}")
    if max_retries < 0:
        raise BackendError(f"max_retries must be >= 0, got {max_retries}")
    url = base_url or os.environ.get("OPENAI_BASE_URL")
    if not url:
        raise BackendError("the openai backend needs the server's URL: pass --base-url "
                           "http://HOST:PORT/v1 (base_url=...) or set OPENAI_BASE_URL")
    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
        raise BackendError(f"base URL {public_url(url)!r} is not an http(s) URL; "
                           "expected something like http://localhost:8000/v1")
    return url


def _client(key: str | None, max_concurrency: int, timeout: float, connect_timeout: float) -> httpx.Client:
    """The HTTP client: the API key as a bearer header (httpx masks it in its reprs; it is kept nowhere else),
    at most `max_concurrency` connections, every try bounded by its deadline."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(
        headers=headers,
        timeout=httpx.Timeout(timeout, connect=min(connect_timeout, timeout)),
        transport=DeadlineTransport(httpx.Limits(max_connections=max_concurrency,
                                                 max_keepalive_connections=max_concurrency)),
    )
