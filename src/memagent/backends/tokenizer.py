"""The one tokenizer loader and the one pad-token fix, used by every backend, the data tools and training.

`load_tokenizer(source, model)` accepts what any caller has in hand:
- a tokenizer object: returned as is;
- None: the tokenizer of `model` (an HTTP server does not expose its tokenizer, so the served model's name is
  tried as a Hugging Face id or directory);
- "tiny": the project's tiny byte-level tokenizer (`memagent.backends.tiny.build_tokenizer`), unless a local
  directory of that name exists (a directory always wins);
- any other string or path: `AutoTokenizer.from_pretrained` of it (a Hugging Face id or a local directory).
A failure of any kind is one `BackendError` that names the tokenizer and says what to pass instead.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from memagent.backends.base import BackendError

TINY = "tiny"


def load_tokenizer(source: Any, model: str | Path | None = None) -> Any:
    """A tokenizer from an object, a name or path, "tiny", or (when `source` is None) the model's name."""
    if source is not None and not isinstance(source, (str, Path)):
        return source
    if source is None and model is None:
        raise BackendError("no tokenizer: name one (a Hugging Face id, a local directory, or 'tiny')")
    name = str(source) if source is not None else str(model)
    if isinstance(source if source is not None else model, str) and name == TINY and not Path(name).exists():
        from memagent.backends.tiny import build_tokenizer

        return build_tokenizer()
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name)
    except Exception as e:  # noqa: BLE001 - any failure to load becomes one clear message
        tried = "" if source is not None else " (no tokenizer was named, so the model name was tried)"
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BackendError(
            f"cannot load the tokenizer {name!r}{tried}: {first_line}\n"
            "Give a Hugging Face id reachable from here (or in the local cache), a local directory holding "
            "tokenizer files, or 'tiny'. The openai backend chunks documents with the served model's own "
            "tokenizer: pass --tokenizer (tokenizer=...)."
        ) from None


def ensure_pad_token(tokenizer: Any) -> Any:
    """Give `tokenizer` a pad token when it has none (its EOS token); returns the same tokenizer.

    Batched generation and training pad their rows; the padded positions are masked, so which id pads them
    does not change any result.
    """
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
