"""The boundary between memagent and a third party's backend (a plug-in: a factory defined outside the memagent
package, found through `register_backend` or the entry-point group `memagent.backends`), as
memagent.agent.guards is for workflows (issue 48, class 1).

What a plug-in raises (or a `sys.exit` it calls) is its fault, not memagent's: a `BackendError` naming the
plug-in and its module. Raised by its factory, it is one error line when the command starts (ask, eval, serve);
raised by `generate` or `prompt_length`, it fails the documents of that call only (the scheduler records a
BackendError as any failed call). What it hands back is checked before memagent acts on it:

- when it is built: a tokenizer (callable, not None) and a window that is None or a positive integer (a window of
  NaN let every budget check pass, a string was a traceback);
- each `generate`: a list of exactly one `Generation` per prompt (fewer left documents waiting forever), each
  reply's text a string of valid UTF-8 (a lone surrogate reached the tokenizer) of at most
  `MAX_CHARS_PER_TOKEN` characters per new token asked for (a 10 MB reply ran until killed), its token ids at
  most `max_new_tokens` integers, its logprobs one number per token;
- each `prompt_length`: an integer >= 0 (a negative one was taken).

The built-in backends are trusted and not wrapped; `GuardedBackend.inner` is the plug-in's own object.
"""
from __future__ import annotations

import math
from concurrent.futures import Future
from typing import Any, Sequence

from memagent.backends.base import BackendError, Generation, SamplingParams
from memagent.errors import MemAgentError
from memagent.plugins import short_error

MAX_CHARS_PER_TOKEN = 256  # the longest tokens of common vocabularies are runs of a few dozen spaces or '='


def plugin_fault(name: str, module: str, what: str, exc: BaseException) -> BackendError:
    """The BackendError of backend plug-in `name` (from `module`) that raised (or exited with) `exc` doing `what`."""
    return BackendError(f"backend {name!r} (a plug-in, module {module}) failed {what}: {short_error(exc)}; this is a "
                        "fault of the plug-in, not of memagent: report it to its authors or choose another --backend")


def build_guarded(name: str, factory: Any, model: Any, **kwargs: Any) -> "GuardedBackend":
    """`factory(model, **kwargs)` of backend plug-in `name`, checked and wrapped (module docstring)."""
    module = getattr(factory, "__module__", None) or "?"
    try:
        backend = factory(model, **kwargs)
    except MemAgentError:
        raise
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the plug-in's fault
        raise plugin_fault(name, module, "as it was built", e) from None
    return GuardedBackend(backend, name, module)


class GuardedBackend:
    """A plug-in's backend behind the checks of the module docstring; every other attribute is the plug-in's own
    (`max_concurrency`, `max_retries`, ...). `submit` exists when the plug-in has one."""

    def __init__(self, inner: Any, name: str, module: str) -> None:
        self.inner, self.plugin_name, self.plugin_module = inner, name, module
        if inner is None or isinstance(inner, (str, bytes, int, float, list, dict, tuple)):
            raise self._wrong(f"its factory returned {type(inner).__name__}, not a backend (an object with "
                              "tokenizer, max_window, generate and prompt_length)")
        for method in ("generate", "prompt_length"):
            if not callable(self._get(method, None)):
                raise self._wrong(f"it has no method {method}")
        _ = (self.tokenizer, self.max_window)  # checked once now: a bad one stops the command at start
        if callable(self._get("submit", None)):
            self.submit = self._submit

    def __getattr__(self, attr: str) -> Any:  # only for what is not defined here
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    @property
    def tokenizer(self) -> Any:
        """The plug-in's tokenizer, read each time (it may set it late), never None."""
        tokenizer = self._get("tokenizer", None)
        if tokenizer is None or not callable(tokenizer):
            raise self._wrong(f"its tokenizer is {type(tokenizer).__name__}, not a tokenizer (memagent chunks "
                              "documents and counts budgets with it)")
        return tokenizer

    @property
    def max_window(self) -> int | None:
        """The plug-in's window, read each time: None or a positive integer (NaN let every budget check pass)."""
        window = self._get("max_window", None)
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
            raise self._wrong(f"its max_window is {window!r}"[:200] + ", not a positive integer or None")
        return window

    def _get(self, attr: str, *default: Any) -> Any:
        try:
            return getattr(self.inner, attr, *default)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - a property that raises
            raise plugin_fault(self.plugin_name, self.plugin_module, f"giving its {attr}", e) from None

    def _wrong(self, what: str) -> BackendError:
        return BackendError(f"backend {self.plugin_name!r} (a plug-in, module {self.plugin_module}) cannot be used: {what}; this "
                            "is a fault of the plug-in, not of memagent: report it to its authors or choose another "
                            "--backend")

    # -- the calls --------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[str], params: SamplingParams) -> list[Generation]:
        try:
            gens = self.inner.generate(prompts, params)
        except MemAgentError:
            raise
        except (Exception, SystemExit) as e:  # noqa: BLE001 - sys.exit(0) in generate was a silent exit 0
            raise plugin_fault(self.plugin_name, self.plugin_module, "generating", e) from None
        return self._checked(gens, len(prompts), params)

    def prompt_length(self, prompt: str) -> int:
        try:
            n = self.inner.prompt_length(prompt)
        except MemAgentError:
            raise
        except (Exception, SystemExit) as e:  # noqa: BLE001
            raise plugin_fault(self.plugin_name, self.plugin_module, "counting a prompt's tokens", e) from None
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise self._wrong(f"prompt_length returned {n!r}"[:200] + ", not an integer >= 0")
        return n

    def _submit(self, prompt: str, params: SamplingParams) -> "Future[Generation]":
        try:
            fut = self.inner.submit(prompt, params)
        except MemAgentError:
            raise
        except (Exception, SystemExit) as e:  # noqa: BLE001
            raise plugin_fault(self.plugin_name, self.plugin_module, "taking a request", e) from None
        out: Future[Generation] = Future()

        def done(f: Any) -> None:
            if f.cancelled():
                out.cancel()
                return
            try:
                out.set_result(self._checked([f.result()], 1, params)[0])
            except MemAgentError as e:
                out.set_exception(e)
            except (Exception, SystemExit) as e:  # noqa: BLE001
                out.set_exception(plugin_fault(self.plugin_name, self.plugin_module, "generating", e))

        out.add_done_callback(lambda o: fut.cancel() if o.cancelled() else None)
        fut.add_done_callback(done)
        return out

    def _checked(self, gens: Any, n: int, params: SamplingParams) -> list[Generation]:
        """`gens` when it is one sound Generation per prompt; BackendError naming what is not."""
        if not isinstance(gens, (list, tuple)):
            raise self._wrong(f"generate returned {type(gens).__name__}, not a list of Generation")
        if len(gens) != n:
            raise self._wrong(f"generate returned {len(gens)} results for {n} prompts (one Generation per prompt, "
                              "in order)")
        limit = params.max_new_tokens * MAX_CHARS_PER_TOKEN
        for g in gens:
            if not isinstance(g, Generation):
                raise self._wrong(f"generate returned a {type(g).__name__} among its results, not a Generation")
            if not isinstance(g.text, str):
                raise self._wrong(f"generate returned a Generation whose text is {type(g.text).__name__}, not text")
            if len(g.text) > limit:
                raise self._wrong(f"generate returned a reply of {len(g.text):,} characters for max_new_tokens "
                                  f"{params.max_new_tokens}, over the bound of {limit:,} ({MAX_CHARS_PER_TOKEN} "
                                  "characters a token)")
            try:
                g.text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise self._wrong(f"generate returned text that is not valid UTF-8 (a lone surrogate at character "
                                  f"{e.start})") from None
            if not _ints(g.token_ids) or len(g.token_ids) > params.max_new_tokens:
                raise self._wrong(f"generate returned token_ids that are not a list of at most "
                                  f"{params.max_new_tokens} integers")
            if g.prompt_token_ids is not None and not _ints(g.prompt_token_ids):
                raise self._wrong("generate returned prompt_token_ids that are not a list of integers")
            if g.logprobs is not None and (not isinstance(g.logprobs, (list, tuple))
                                           or len(g.logprobs) != len(g.token_ids)
                                           or not all(_number(x) for x in g.logprobs)):
                raise self._wrong("generate returned logprobs that are not one number per generated token")
            if not isinstance(g.finish_reason, str):
                raise self._wrong(f"generate returned a finish_reason of type {type(g.finish_reason).__name__}")
        return list(gens)


def _ints(values: Any) -> bool:
    return isinstance(values, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)
