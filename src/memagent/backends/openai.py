"""The `openai` backend: any OpenAI-compatible HTTP server (vLLM, SGLang, llama.cpp's server).

One request per prompt (chat completions, or plain completions with `use_chat=False`), at most `max_concurrency`
in flight, results in input order; `submit(prompt, params)` returns a Future and `generate` is built on it. The
transport (memagent.backends.openai_http: a deadline per try, bounded retries with back-off), replicas
(`URL1,URL2,...`: memagent.backends.replicas) and the checks of every reply (memagent.backends.openai_reply) live
beside it; what each fault gets: docs/faults.md. The API key is read from the environment and never printed.

Chunking and budgets need the served model's tokenizer, named separately (an HTTP server does not expose it);
`prompt_length` renders the prompt with its chat template, as the server does. Exact token ids come back only
when the server offers them (vLLM's `return_token_ids`, or `return_tokens_as_token_ids`: `request_token_ids=True`
asks for both); otherwise the reply is re-tokenised (plus the EOS id when the server stopped) and its log-probs
kept only when their count matches. For training: a server's log-probs may be the raw model's (vLLM's default,
before temperature); the trainer recomputes its own.
"""
from __future__ import annotations

import logging
import math
import os
import threading
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from dataclasses import replace
from typing import Any, Sequence

from memagent.backends.base import BackendError, Generation, SamplingParams
from memagent.backends.chat import encode_prompt, resolve_chat_template
from memagent.backends.openai_http import Batch, Cancelled, Settings, Transport, backoff_delay, public_url, retryable
from memagent.backends.openai_reply import parse_choice, prompt_tokens, served_models
from memagent.backends.replicas import split_base_urls
from memagent.backends.tokenizer import load_tokenizer

__all__ = ["OpenAIBackend", "backoff_delay", "parse_choice", "public_url", "retryable"]

log = logging.getLogger(__name__)


def _config_window(tokenizer: Any) -> int | None:
    """max_position_embeddings of the model config next to the tokenizer, when there is one."""
    name = getattr(tokenizer, "name_or_path", None)
    if not name:
        return None
    try:
        from transformers import AutoConfig  # lazy: transformers

        return getattr(AutoConfig.from_pretrained(name), "max_position_embeddings", None)
    except Exception:  # noqa: BLE001 - the window is optional information
        return None


class OpenAIBackend:
    """Backend over an OpenAI-compatible server (one, or several replicas of it).

    model: the served model's name (as the server lists it in /v1/models).
    base_url: e.g. http://localhost:8000/v1, or replicas as URL1,URL2,...; default $OPENAI_BASE_URL.
    tokenizer: HF id, local directory or tokenizer object for chunking; default the model name.
    api_key_env: environment variable holding the key (sent as a Bearer token; optional).
    max_concurrency: requests in flight at once, across all calls and replicas of this backend.
    timeout: seconds one try of a request may take in all, from connecting to the reply's last byte
        (a reply takes as long as its whole generation).
    max_retries / backoff / max_backoff / retry_seed: retries after the first try, the first
        back-off in seconds (doubling, jittered; also how long a failed replica first rests), its
        cap, and the jitter's seed.
    use_chat: chat-completions endpoint (the server applies the chat template) or completions.
    want_logprobs / request_token_ids: see the module docstring.
    max_window: the model's context length; default the server's max_model_len (the smallest over
        the replicas), else the config next to the tokenizer, else None.
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
        urls = _checked_urls(base_url, max_concurrency, timeout, connect_timeout, max_retries)
        self.model = model
        self.base_urls = urls
        self.base_url = ",".join(urls)
        self.api_key_env = api_key_env
        self.max_concurrency = max_concurrency
        self.timeout = timeout
        self.max_retries = max_retries
        self.use_chat = use_chat
        self.want_logprobs = want_logprobs
        self.request_token_ids = request_token_ids
        self.extra_body = dict(extra_body or {})
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        if self.chat_template_kwargs and use_chat:
            self.extra_body["chat_template_kwargs"] = {**self.extra_body.get("chat_template_kwargs", {}),
                                                       **self.chat_template_kwargs}
        self._notes: set[str] = set()
        self._tok_lock = threading.Lock()  # the tokenizer is used from the caller's and the loop's thread
        self.tokenizer = load_tokenizer(tokenizer, model)
        self.use_chat_template = use_chat and resolve_chat_template(self.tokenizer, "auto")
        if use_chat and not self.use_chat_template:
            log.warning("openai backend: the tokenizer has no chat template, so prompt lengths are "
                        "counted without the server's template (budgets may be a little short)")
        settings = Settings(timeout, connect_timeout, max_concurrency, max_retries, backoff, max_backoff, retry_seed)
        self._http = Transport(urls, os.environ.get(api_key_env) or None, settings, model=model,
                               api_key_env=api_key_env)
        try:
            served_window = self.check_model() if check_server else None
        except BaseException:
            self.close()
            raise
        self.max_window = max_window or served_window or _config_window(self.tokenizer)

    def __repr__(self) -> str:
        key = f"${self.api_key_env}" if self._http.has_key else "none"
        return (f"OpenAIBackend(model={self.model!r}, base_url={public_url(self.base_url)!r}, "
                f"api_key={key}, max_concurrency={self.max_concurrency}, use_chat={self.use_chat})")

    def close(self) -> None:
        self._http.close()

    def redact(self, text: str) -> str:
        """`text` without this backend's API key or any Bearer token (for messages made elsewhere of its errors,
        e.g. `memagent serve`'s job errors)."""
        return self._http.scrub(text)

    # -- prompts ---------------------------------------------------------------------------
    def encode(self, prompt: str) -> list[int]:
        """The prompt's ids as the server renders it (chat template of the same tokenizer)."""
        with self._tok_lock:
            return encode_prompt(self.tokenizer, prompt, self.use_chat_template, self.chat_template_kwargs)

    def prompt_length(self, prompt: str) -> int:
        return len(self.encode(prompt))

    # -- the server ------------------------------------------------------------------------
    def check_model(self) -> int | None:
        """GET /models of every replica: fail now on a wrong URL or model; return the served max_model_len
        (the smallest over the replicas). A replica that cannot be reached is a warning while another answers.

        With several replicas each is first asked once, within the connect timeout: a dead one does not hold
        the start for its retries while another answers (the router tries it again once it has rested).
        Only when none answers does every replica get its retries (a server still starting up)."""
        quick = dict(max_retries=0, timeout=min(self.timeout, self._http.s.connect_timeout))
        windows, errors = self._ask_models(quick if len(self.base_urls) > 1 else {})
        if len(errors) == len(self.base_urls) and len(self.base_urls) > 1:
            windows, errors = self._ask_models({})
        if len(errors) == len(self.base_urls):
            raise errors[0]
        for e in errors:
            log.warning("openai backend: %s; going on with the other replicas", e)
        known = [w for w in windows if w is not None]
        return min(known) if known else None

    def _ask_models(self, how: dict[str, Any]) -> tuple[list[int | None], list[BackendError]]:
        """(the served windows, the errors) of GET /models sent to each replica at once."""
        futures = [self._http.submit(self._http.call("GET", "/models", None, allow_404=True, replica=i, **how))
                   for i in range(len(self.base_urls))]
        windows, errors = [], []
        for url, f in zip(self.base_urls, futures):
            try:
                listing, _ = f.result()
            except BackendError as e:
                errors.append(e)
                continue
            if listing is not None:  # some servers have no /models; generation will tell
                windows.append(self._served_window(listing, url))
        return windows, errors

    def _served_window(self, listing: Any, url: str) -> int | None:
        served = served_models(listing, public_url(url + "/models"))
        ids = [m["id"] for m in served]
        if served and self.model not in ids:
            raise BackendError(f"the server at {public_url(url)} does not serve model "
                               f"{self.model!r}; it serves: {', '.join(map(str, ids))}. Pass one as --model")
        return next((m.get("max_model_len") for m in served if m.get("id") == self.model), None)

    def _body(self, prompt: str, params: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = dict(model=self.model, max_tokens=params.max_new_tokens,
                                    temperature=params.temperature, top_p=params.top_p, n=1, stream=False)
        if self.use_chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if params.seed is not None:
            body["seed"] = params.seed
        if self.want_logprobs:
            body["logprobs"] = True if self.use_chat else 1
        if self.request_token_ids:
            body["return_token_ids"] = True
            if self.want_logprobs:
                body["return_tokens_as_token_ids"] = True
        body.update(self.extra_body)
        return body

    # -- generation ------------------------------------------------------------------------
    def submit(self, prompt: str, params: SamplingParams) -> "Future[Generation]":
        """Send one request now (at most max_concurrency in flight); its Generation arrives in the future.
        The request carries `params.seed` as is. Cancelling the future cancels the request."""
        return self._http.submit(self._one(prompt, params, None))

    def generate(self, prompts: Sequence[str], params: SamplingParams) -> list[Generation]:
        """One Generation per prompt, in order; request i carries seed + i (equal prompts, different
        samples). The first failure cancels the rest (queued requests are never sent) and is raised."""
        if not prompts:
            return []
        batch = Batch()
        seeded = [params if params.seed is None else replace(params, seed=params.seed + i) for i in range(len(prompts))]
        futures = [self._http.submit(self._one(p, sp, batch)) for p, sp in zip(prompts, seeded)]
        try:
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in futures if f in done and f.exception() is not None]
        except BaseException:
            _cancel(batch, futures)
            raise
        if failed:
            _cancel(batch, futures)
            failed.sort(key=lambda f: isinstance(f.exception(), Cancelled))  # the cause first
            raise failed[0].exception()
        return [f.result() for f in futures]

    async def _one(self, prompt: str, params: SamplingParams, batch: Batch | None) -> Generation:
        path = "/chat/completions" if self.use_chat else "/completions"
        data, url = await self._http.call("POST", path, self._body(prompt, params), batch=batch)
        return self._parse(prompt, data, public_url(url + path))

    def _parse(self, prompt: str, data: Any, where: str) -> Generation:
        with self._tok_lock:
            gen, note = parse_choice(data, chat=self.use_chat, tokenizer=self.tokenizer,
                                     want_logprobs=self.want_logprobs, where=where)
        if note and note not in self._notes:
            self._notes.add(note)
            log.warning("openai backend: %s", note)
        counted = prompt_tokens(data, where) if gen.prompt_token_ids is None else None
        if counted is not None:
            local = self.encode(prompt)
            if counted == len(local):
                gen.prompt_token_ids = local  # the server counted as many: same rendering
        return gen


def _cancel(batch: Batch, futures: list["Future[Generation]"]) -> None:
    batch.failed = True
    for f in futures:
        f.cancel()


def _checked_urls(base_url: str | None, max_concurrency: int, timeout: float, connect_timeout: float,
                  max_retries: int) -> list[str]:
    """The replicas' URLs (`base_url`, else $OPENAI_BASE_URL; comma-separated) once the client settings are checked."""
    if max_concurrency < 1:
        raise BackendError(f"max_concurrency must be at least 1, got {max_concurrency}")
    if not (math.isfinite(timeout) and math.isfinite(connect_timeout)) or timeout <= 0 or connect_timeout <= 0:
        raise BackendError(f"timeouts must be positive, got timeout={timeout}, connect_timeout={connect_timeout}")
    if max_retries < 0:
        raise BackendError(f"max_retries must be >= 0, got {max_retries}")
    text = base_url or os.environ.get("OPENAI_BASE_URL")
    if not text:
        raise BackendError("the openai backend needs the server's URL: pass --base-url "
                           "http://HOST:PORT/v1 (base_url=...) or set OPENAI_BASE_URL")
    return split_base_urls(text)
