"""The one tokenizer loader and the one pad-token fix, used by every backend, the data tools and training.

`load_tokenizer(source, model)` accepts what any caller has in hand:
- a tokenizer object: returned as is;
- None: the tokenizer of `model` (an HTTP server does not expose its tokenizer, so the served model's name is
  tried as a Hugging Face id or directory);
- "tiny": the project's tiny byte-level tokenizer (`memagent.backends.tiny.build_tokenizer`), unless a local
  directory of that name exists (a directory always wins);
- any other string or path: `AutoTokenizer.from_pretrained` of it (a Hugging Face id or a local directory).
A failure of any kind is one `BackendError` that names the tokenizer and says what to pass instead.

A tokenizer loaded by name must be the model's own (`check_tokenizer`): `AutoTokenizer` builds an EMPTY
tokenizer of the config's class when a folder's tokenizer files are missing (it then encodes every document to
0 tokens and the run "answers" from nothing), so a local folder must hold a vocabulary file, and the loaded
tokenizer must encode a probe text to tokens that decode back to it. `check_vocab` compares it with the model's
embedding (`vocab_size` of config.json): see its docstring for which mismatch is refused and which is masked.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from memagent.backends import tiny
from memagent.backends.base import BackendError
from memagent.backends.gguf import resolve_model

log = logging.getLogger(__name__)

TINY = "tiny"
# a folder holds the model's own tokenizer when it has one of these (fast tokenizers, BPE, SentencePiece, WordPiece)
VOCAB_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
               "vocab.txt", "tiktoken.model", "qwen.tiktoken")
PROBE_TEXT = "The river Avon flows past 42 old mills."


def load_tokenizer(source: Any, model: str | Path | None = None) -> Any:
    """A tokenizer from an object, a name or path, "tiny", or (when `source` is None) the model's name."""
    if source is not None and not isinstance(source, (str, Path)):
        return source
    if source is None and model is None:
        raise BackendError("no tokenizer: name one (a Hugging Face id, a local directory, or 'tiny')")
    name = str(source) if source is not None else str(model)
    if isinstance(source if source is not None else model, str) and name == TINY and not Path(name).exists():
        return tiny.build_tokenizer()
    tried = "" if source is not None else " (no tokenizer was named, so the model name was tried)"
    name = str(resolve_model(name, weights=False))  # a GGUF file: the tokenizer of its converted folder
    _check_files(name, tried)
    try:
        from transformers import AutoTokenizer  # lazy: transformers

        tokenizer = AutoTokenizer.from_pretrained(name)
    except Exception as e:  # noqa: BLE001 - any failure to load becomes one clear message
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BackendError(
            f"cannot load the tokenizer {name!r}{tried}: {first_line}\n"
            "Give a Hugging Face id reachable from here (or in the local cache), a local directory holding "
            "tokenizer files, or 'tiny'. The openai backend chunks documents with the served model's own "
            "tokenizer: pass --tokenizer (tokenizer=...)."
        ) from None
    return check_tokenizer(tokenizer, name)


def _check_files(name: str, tried: str) -> None:
    """A local folder must hold a vocabulary file; without one AutoTokenizer silently builds an empty tokenizer."""
    folder = Path(name)
    if not folder.is_dir() or any((folder / f).is_file() for f in VOCAB_FILES):
        return
    raise BackendError(
        f"the tokenizer {name!r}{tried} has no vocabulary file (none of {', '.join(VOCAB_FILES[:4])}, ...); "
        "copy the model's tokenizer files (save_pretrained writes tokenizer.json) into the folder, or name the "
        "model's tokenizer with --tokenizer / tokenizer=")


def check_tokenizer(tokenizer: Any, name: str) -> Any:
    """`tokenizer` itself when it encodes PROBE_TEXT to >0 tokens that decode back to it, else a BackendError."""
    try:
        ids = list(tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"])
        text = tokenizer.decode(ids, skip_special_tokens=True) if ids else ""
    except Exception as e:  # noqa: BLE001 - a tokenizer that cannot encode plain text is not usable
        raise BackendError(f"the tokenizer {name!r} cannot encode plain text ({type(e).__name__}: {e}); "
                           "give the model's own tokenizer") from None
    if not ids:
        raise BackendError(f"the tokenizer {name!r} encodes text to 0 tokens (its vocabulary is empty or missing); "
                           "copy the model's tokenizer files into the folder or name its tokenizer")
    unk = getattr(tokenizer, "unk_token_id", None)
    if (" ".join(text.split()).lower() != " ".join(PROBE_TEXT.split()).lower()
            and not (unk is not None and unk in ids and _round_trips_own_words(tokenizer, unk))):
        raise BackendError(f"the tokenizer {name!r} does not decode what it encodes ({PROBE_TEXT!r} came back as "
                           f"{text[:80]!r}); give the model's own tokenizer")
    return tokenizer


def _round_trips_own_words(tokenizer: Any, unk: int) -> bool:
    """For a tokenizer with an unknown-token id (a word-level vocabulary, e.g. the demo's toy tokenizer, maps the
    probe's words to it): up to 16 of its own alphanumeric words encode without the unknown id and decode back."""
    words = sorted(w for w in tokenizer.get_vocab() if w.isalnum() and w not in tokenizer.all_special_tokens)[:16]
    if not words:
        return False
    ids = list(tokenizer(" ".join(words), add_special_tokens=False)["input_ids"])
    back = tokenizer.decode(ids, skip_special_tokens=True)
    return bool(ids) and unk not in ids and back.split() == words


def check_vocab(tokenizer: Any, vocab_size: Any, name: str) -> int:
    """How many token ids the model may emit: refuses a tokenizer the embedding cannot hold, masks the rest.

    - vocab_size not a positive integer: refused (the model has no output layer to speak of).
    - len(tokenizer) > vocab_size: refused, the tokenizer makes ids the embedding has no row for.
    - len(tokenizer) < vocab_size: allowed, as real models pad their embedding to a multiple of 64/128
      (Qwen2.5: 151,665 tokens, 152,064 rows). The ids past the tokenizer decode to "" (the empty memories the
      official MemAgent repository's users met), so generation masks them (`VocabMask`); a gap larger than
      padding explains is logged as a warning.
    Returns len(tokenizer): the ids [0, that) are the ones generation may sample.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= 0:
        raise BackendError(f"the model {name!r} has vocab_size {vocab_size!r} in config.json; it must be a positive "
                           "integer (the rows of its embedding): fix config.json")
    size = len(tokenizer)
    if size > vocab_size:
        raise BackendError(f"the tokenizer of {name!r} has {size} tokens but the model's embedding only "
                           f"{vocab_size} (config vocab_size): it is not this model's tokenizer; use its own")
    gap = vocab_size - size
    if gap > max(128, vocab_size // 100):
        log.warning("model %s: config vocab_size %d is %d above the tokenizer's %d tokens; those ids have no text "
                    "and are masked out of generation (is this the model's own tokenizer?)", name, vocab_size, gap,
                    size)
    return size


class VocabMask:
    """A logits processor that sets the scores of ids >= `size` to -inf: (B, V) -> (B, V).

    Used when the embedding is padded past the tokenizer (`check_vocab`), so no sampled id decodes to ""."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if scores.shape[-1] > self.size:
            scores[..., self.size:] = float("-inf")
        return scores


def ensure_pad_token(tokenizer: Any) -> Any:
    """Give `tokenizer` a pad token when it has none (its EOS token); returns the same tokenizer.

    Batched generation and training pad their rows; the padded positions are masked, so which id pads them
    does not change any result.
    """
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
