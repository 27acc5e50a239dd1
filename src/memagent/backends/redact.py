"""What a server must not learn back, and what a log may show of a URL: pure string functions, with no HTTP
library behind them (the openai SDK takes about 0.9 s to import; the CLI's error handler and eval's summary
need only these). Used by the openai backend (memagent.backends.openai_http) on every reply and error.

    public_url(url)          a URL (or comma-separated URLs) without user:password@ and without a query string
    redact(text, key)        `text` with the API key replaced by *** wherever it appears: any case, spaced or cut
                             (a run of its first 6+ letters and digits), encoded (base64 in both alphabets at
                             any offset, hex in either case, percent-encoding; so also inside an encoded
                             `Bearer KEY` header), and every `Bearer` token
    redact_tree(value, key)  a decoded JSON reply with every string redacted
"""
from __future__ import annotations

import base64
import functools
import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit


@functools.lru_cache(maxsize=256)  # called per reply, with the few URLs of the replicas
def public_url(url: str) -> str:
    """`url` (or a comma-separated list of URLs) without user:password@ and without a query string, safe to
    print; never raises (a URL that does not parse is shown with its credentials and query cut out)."""
    if "," in url:
        return ",".join(public_url(u.strip()) for u in url.split(","))
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        if parts.port is not None:
            netloc += f":{parts.port}"
    except ValueError:  # a port over 65535, a broken [IPv6] literal: the text without what may be secret
        return re.sub(r"//[^/?#]*@", "//", url).split("?")[0].split("#")[0]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


# -- redaction of the API key -------------------------------------------------------------------------
_KEY_PREFIX = 6  # a run of the key's first 6+ letters and digits is taken for the key (a cut echo of it)
_FUZZY_MIN = 8  # keys of fewer letters and digits ("EMPTY", "unused") are only replaced where exact
_SEP = r"[\W_]{0,4}"  # what a hostile echo may put between the key's characters: spaces, dashes, dots
_BEARER = re.compile(r"(?i)\b(bearer)(\s+)[^\s\"',;)}\]]+")


@functools.lru_cache(maxsize=8)
def _key_pattern(key: str) -> tuple[re.Pattern[str], str] | None:
    """(a pattern of the key's first letters and digits with any separators between, case-insensitive;
    all of the key's letters and digits, lower-cased), or None for a short key."""
    chars = "".join(c for c in key if c.isalnum()).lower()
    if len(chars) < _FUZZY_MIN:
        return None
    return re.compile(_SEP.join(re.escape(c) for c in chars[:_KEY_PREFIX]), re.IGNORECASE), chars


def redact(text: str, key: str | None, bearer: bool = True) -> str:
    """`text` with the API key replaced by "***" wherever it appears: in any case, with any spacing or
    punctuation between its characters, or only a prefix of it (6+ letters and digits, e.g. an echo cut
    at a length limit); and (`bearer`) every `Bearer TOKEN` as `Bearer ***`, whatever the token. Run it
    before any cut of the text. A reply's own text is redacted of the key only (`bearer=False`)."""
    if key:
        text = _redact_encoded(text, key)
        text = text.replace(key, "***")
        found = _key_pattern(key)
        if found is not None:
            text = _redact_fuzzy(text, *found)
    if bearer and "bearer" in text.lower():
        text = _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}***", text)
    return text


# -- the key encoded: what a hostile server may echo of `Authorization: Bearer KEY` ----------------------------
_ENCODED_MIN = 8  # a run of 8+ characters of an encoding of the key (a cut echo included) is taken for it


@functools.lru_cache(maxsize=8)
def _encodings(key: str) -> tuple[tuple[str, ...], tuple[str, ...], re.Pattern[str] | None]:
    """(base64 runs, hex and %XX runs, percent pattern) of `key`. Base64 runs: for each of the 3 offsets the key may
    start at inside a longer encoded text (e.g. after `Bearer `), the characters that depend on the key's bytes
    only, in the standard and the URL-safe alphabet. Hex runs: lower case (matched in any case). Percent: each
    byte as itself or %XX (any case), so `quote(key)` and an all-%XX form alike."""
    raw = key.encode("utf-8")
    b64: list[str] = []
    for offset in range(3):
        whole = base64.b64encode(b"\0" * offset + raw).decode().rstrip("=")
        core = whole[(0, 2, 3)[offset]: (8 * (offset + len(raw))) // 6]  # drop chars mixing in unknown bits
        b64 += [core, core.translate(str.maketrans("+/", "-_"))]
    percent = None
    if len(raw) >= _ENCODED_MIN:
        percent = re.compile("".join(
            f"(?:{re.escape(chr(b))}|%{b:02x})" if b < 128 else f"%{b:02x}" for b in raw), re.IGNORECASE)
    every_byte = "".join(f"%{b:02x}" for b in raw)  # all of it %XX: a cut echo of it is a run too
    return tuple(dict.fromkeys(e for e in b64 if len(e) >= _ENCODED_MIN)), (raw.hex(), every_byte), percent


def _redact_encoded(text: str, key: str) -> str:
    """`text` with every encoding of the key (`_encodings`), or a run of 8+ of its first characters (an echo
    cut short), replaced by "***"."""
    b64, hexes, percent = _encodings(key)
    for run in b64:
        text = _redact_runs(text, run, ignore_case=False)
    for run in hexes:
        text = _redact_runs(text, run, ignore_case=True)
    if percent is not None and "%" in text:
        text = percent.sub("***", text)
    return text


def _redact_runs(text: str, run: str, ignore_case: bool) -> str:
    """Each place where `text` holds `run`'s first _ENCODED_MIN characters, as far as it goes on matching
    `run`, replaced by "***"."""
    hay, needle = (text.lower(), run.lower()) if ignore_case else (text, run)
    head = needle[:_ENCODED_MIN]
    i = hay.find(head)
    if i < 0:
        return text
    out, last = [], 0
    while i >= 0:
        end, j = i + len(head), len(head)
        while j < len(needle) and end < len(hay) and hay[end] == needle[j]:
            end, j = end + 1, j + 1
        out += [text[last:i], "***"]
        last = end
        i = hay.find(head, end)
    return "".join(out) + text[last:]


def _redact_fuzzy(text: str, prefix: re.Pattern[str], chars: str) -> str:
    """Each match of the key's prefix, extended over as many of the key's further characters as follow it
    (separators allowed between them), replaced by "***". A short piece inside a word ("risk probe" for a key
    "sk-probe...") is left alone; the whole key, or 12+ of its first characters, is taken anywhere."""
    out, last = [], 0
    for m in prefix.finditer(text):
        if m.start() < last:
            continue
        end, j = m.end(), _KEY_PREFIX
        while j < len(chars):
            k = end
            while k < len(text) and k - end < 4 and not text[k].isalnum():
                k += 1
            if k < len(text) and text[k].lower() == chars[j]:
                end, j = k + 1, j + 1
            else:
                break
        in_word = m.start() > 0 and text[m.start() - 1].isalnum()
        if in_word and j < min(len(chars), 2 * _KEY_PREFIX):
            continue
        out += [text[last:m.start()], "***"]
        last = end
    return "".join(out) + text[last:] if out else text


def redact_tree(value: Any, key: str) -> Any:
    """A decoded reply with every string (object keys included) redacted of `key`; depth already checked.
    A short key ("EMPTY", the vLLM convention for none) is no secret: the reply is left as it is."""
    if _key_pattern(key) is None:
        return value
    if isinstance(value, str):
        return redact(value, key, bearer=False)
    if isinstance(value, list):
        return [redact_tree(v, key) for v in value]
    if isinstance(value, dict):
        return {redact(k, key, bearer=False): redact_tree(v, key) for k, v in value.items()}
    return value
