"""The one decoding rule for text that enters as a Python `str`: it must be valid UTF-8, so no surrogates.

Python lets two kinds of text in that cannot be written back out as UTF-8 (the first `.encode()` further on, a
JSON dump, an HTML report or a tokenizer then fails with a traceback):

- command-line arguments: bytes that are not UTF-8 (`$'\\xff'`, or `$'\\xed\\xa0\\x80'`, a surrogate encoded)
  reach `sys.argv` as the surrogate escapes U+DC80..U+DCFF;
- JSON strings: a `\\ud800` escape without its pair decodes to a lone surrogate.

The rule: such text is refused where it enters (argv in `memagent.cli.run`, every string of a JSON or YAML
value in `memagent.bounded`), with a message naming the flag or the field and the character; it is never
replaced or dropped silently. A leaf module: it imports nothing from memagent.
"""
from __future__ import annotations

import re
from typing import Sequence

__all__ = ["bad_char", "check_argv", "describe_bad", "not_utf8"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def bad_char(text: str) -> int | None:
    """The index of the first character of `text` that UTF-8 cannot hold (a surrogate), or None."""
    m = _SURROGATE.search(text)
    return None if m is None else m.start()


def describe_bad(text: str, i: int) -> str:
    """What the character at `i` is: a byte that was not UTF-8 (a surrogate escape) or a lone surrogate."""
    code = ord(text[i])
    if 0xDC80 <= code <= 0xDCFF:
        return f"the byte 0x{code - 0xDC00:02x} at character {i} is not UTF-8"
    return f"a lone surrogate U+{code:04X} at character {i}"


def not_utf8(what: str, text: str, i: int, fix: str) -> str:
    """The message for `what` holding the bad character `text[i]`."""
    return f"{what} holds text that is not valid UTF-8 ({describe_bad(text, i)}); {fix}"


def check_argv(args: Sequence[str]) -> str | None:
    """The error message for the first argument that is not valid UTF-8 (naming its flag), or None."""
    for n, arg in enumerate(args):
        i = bad_char(arg)
        if i is None:
            continue
        if arg.startswith("-"):
            what = arg.split("=", 1)[0]
        elif n > 0 and args[n - 1].startswith("-"):
            what = args[n - 1]
        else:
            what = f"argument {n + 1}"
        return not_utf8(what, arg, i, "pass UTF-8 text (check the encoding of the terminal or the script)")
    return None
