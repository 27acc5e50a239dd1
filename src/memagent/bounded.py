"""The one reader of JSON and YAML that users (and servers) hand us: every size bounded, safe tags only.

A value that passes is plain data (dict, list, str, int, float, bool, None) that the rest of the code can walk,
print and dump without surprise:

- depth: at most `MAX_DEPTH` levels of lists/objects (a record nested 100,000 deep otherwise exhausts the
  recursion limit or memory further on); checked without recursion;
- size: at most `max_chars` characters per record or file (`DATA_CHARS` for data, `CONFIG_CHARS` for configs);
- integers: at most `MAX_INT_DIGITS` (4,300) digits, Python's own bound, turned into a clear error (a seed, a
  length or a count has its own, much smaller bound where it is checked);
- text: valid UTF-8 only (`memagent.text`: a lone surrogate from a `\\ud800` escape is refused, naming the field);
- a leading byte order mark (U+FEFF, written by some Windows editors) is accepted and stripped;
- YAML: no explicit tags at all (`!!float`, `!!binary`, `!!python/...`: a tag can change a value's type, so a
  value is written plainly), dates stay strings (no timestamp resolution), and aliases may expand to at most
  `MAX_YAML_NODES` nodes (an alias bomb is refused before anything is built).

Each function takes `where` (the place named in the message: "FILE", "FILE:LINE", "the server at URL") and
`error`, the MemAgentError subclass of the caller's layer. JSON arrays too large to hold are streamed one
item at a time (`iter_json_array`), each item read by `loads_json`.
"""
from __future__ import annotations

import json
import re
import sys
from typing import Any, BinaryIO, Iterator

from memagent.text import bad_char, not_utf8

__all__ = ["CONFIG_CHARS", "DATA_CHARS", "MAX_DEPTH", "MAX_INT_DIGITS", "MAX_YAML_NODES", "check_tree",
           "iter_json_array", "load_yaml", "loads_json"]

MAX_DEPTH = 64  # our records nest 4 levels, configs 3; 64 leaves room and is far below the recursion limit
MAX_INT_DIGITS = 4300  # Python's own bound for parsing an int (sys.int_info.default_max_str_digits)
MAX_YAML_NODES = 100_000  # a train config has about 100 nodes
DATA_CHARS = 1 << 30  # a data record or whole data file (a HotpotQA train file is 570 MB)
CONFIG_CHARS = 16 << 20  # a config, profile, settings file or server reply

BOM = "\ufeff"
_DIGITS_SAID = re.compile(r"has (\d+) digits")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_TEXT_FIX = "write the text as UTF-8 (a \\u escape of a surrogate must be a whole pair)"


def _size(text: str, where: str, error: type[Exception], max_chars: int) -> str:
    if len(text) > max_chars:
        raise error(f"{where}: {len(text):,} characters, more than the {max_chars:,} allowed; "
                    "split it or give a smaller file")
    return text[1:] if text.startswith(BOM) else text


def _int(digits: str) -> int:
    """The int hook, only where Python's own bound on int parsing is off or wider than ours."""
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"value has {len(digits.lstrip('-'))} digits")
    return int(digits)


def _too_long(digits: int, where: str, error: type[Exception]) -> Exception:
    return error(f"{where}: an integer of {digits:,} digits, more than the {MAX_INT_DIGITS:,} allowed; write it as "
                 "a string if it is an id")


def _too_deep(where: str, error: type[Exception]) -> Exception:
    return error(f"{where}: nested more than {MAX_DEPTH} levels deep; give plain records (no deep nesting)")


def loads_json(text: str, where: str, error: type[Exception], max_chars: int = DATA_CHARS,
               syntax: str = "{where}: not valid JSON ({reason})") -> Any:
    """The JSON value in `text`, bounded as the module says; anything else raises `error` naming `where`
    (`syntax`: the message of text that is not JSON at all, with the caller's hint)."""
    text = _size(text, where, error, max_chars)
    own_bound = 0 < sys.get_int_max_str_digits() <= MAX_INT_DIGITS  # then int() refuses longer ones itself
    try:
        value = json.loads(text, parse_int=None if own_bound else _int)
    except json.JSONDecodeError as exc:
        reason = exc.msg if exc.lineno == 1 else f"{exc.msg} at line {exc.lineno} column {exc.colno}"
        raise error(syntax.format(where=where, reason=reason)) from None
    except ValueError as exc:  # an int over the bound: "... value has N digits ..."
        said = _DIGITS_SAID.search(str(exc))
        if said is None:
            raise
        raise _too_long(int(said.group(1)), where, error) from None
    except RecursionError:
        raise _too_deep(where, error) from None
    if bad_char(text) is not None or _SURROGATE_ESCAPE.search(text):
        check_tree(value, where, error)  # the walk finds the field (an escaped pair is fine)
    elif text.count("[") + text.count("{") > MAX_DEPTH:
        check_tree(value, where, error, text=False)  # only a text with that many brackets can nest too deep
    return value


def check_tree(value: Any, where: str, error: type[Exception], text: bool = True) -> Any:
    """`value` when it nests at most MAX_DEPTH levels and (with `text`) holds only valid UTF-8 text, keys
    included; walked with a stack, never recursion. Messages name the top-level field the problem is under."""
    kinds = (str, dict, list) if text else (dict, list)
    stack: list[tuple[Any, int, str | None]] = [(value, 0, None)]
    while stack:
        node, depth, field = stack.pop()
        if type(node) is str:
            i = bad_char(node)
            if i is not None:
                place = f"{where}, field {field!r}:" if field is not None else f"{where}:"
                raise error(not_utf8(place, node, i, _TEXT_FIX))
            continue
        if not isinstance(node, (dict, list)):
            continue
        if depth >= MAX_DEPTH:
            raise _too_deep(where, error)
        if isinstance(node, dict):
            for k, v in node.items():
                name = field if field is not None else str(k)
                if text:
                    stack.append((k, depth + 1, name))
                if isinstance(v, kinds):
                    stack.append((v, depth + 1, name))
        else:
            stack.extend((v, depth + 1, field) for v in node if isinstance(v, kinds))
    return value


# ---------------------------------------------------------------- JSON arrays, one item at a time
_STRUCTURE = re.compile(rb'["\[\]{}]')


def _string_end(buf: bytes, i: int) -> int | None:
    """The offset just past the closing quote of the string whose opening quote is at `i`; None when the
    string does not end in `buf` (memchr speed: a quote preceded by an odd number of backslashes is escaped)."""
    j = buf.find(b'"', i + 1)
    while j != -1:
        k = j
        while buf[k - 1] == 0x5C:  # a backslash
            k -= 1
        if (j - k) % 2 == 0:
            return j + 1
        j = buf.find(b'"', j + 1)
    return None


def iter_json_array(fh: BinaryIO, where: str, error: type[Exception], max_item: int = DATA_CHARS,
                    block: int = 1 << 20) -> Iterator[tuple[int, bytes]]:
    """(index, bytes) of each item of the JSON array in binary file `fh`, without parsing it: strings and
    brackets are tracked to find the items, so a file of any size is read in bounded memory and an item
    nested more than MAX_DEPTH levels is refused before it is parsed. Parse each item with `loads_json`."""
    buf, pos, depth, start, index, eof, after_comma = b"", 0, 0, 0, 0, False, False
    while True:
        m = _STRUCTURE.search(buf, pos)
        end = None if m is None else m.end() if m.group() != b'"' else _string_end(buf, m.start())
        if end is None:
            if eof:
                if m is not None and depth:
                    index += sum(1 for _ in _commas(buf, pos, m.start())) if depth == 1 else 0
                    raise error(f"{where}: not valid JSON at or after record {index} (a string is not closed)")
                break
            keep = start if depth else pos
            buf, pos, start = buf[keep:], pos - keep, start - keep
            if len(buf) - start > max_item:
                raise error(f"{where}: record {index} is over {max_item:,} bytes; split the file")
            more = fh.read(max(block, len(buf), 4))  # doubling: a long string is not rescanned from its start
            eof = not more
            if depth == 0 and not buf and index == 0 and more.startswith(BOM.encode()):
                more = more[3:]  # a leading byte order mark
            buf += more
            continue
        assert m is not None
        tok, s = m.group(), m.start()
        if depth == 0:
            if tok != b"[" or buf[pos:s].strip():
                raise error(f"{where}: not a JSON array (it must start with '[')")
            depth, start, pos = 1, end, end
            continue
        if depth == 1:
            for comma in _commas(buf, pos, s):
                yield index, buf[start:comma]
                index, start, after_comma = index + 1, comma + 1, True
        if tok in (b"[", b"{"):
            depth += 1
            if depth > MAX_DEPTH + 1:
                raise _too_deep(f"{where}: record {index}", error)
        elif tok in (b"]", b"}"):
            depth -= 1
            if depth == 0:
                last = buf[start:s]
                if last.strip() or after_comma:
                    yield index, last
                if buf[end:].strip() or fh.read(1 << 16).strip():
                    raise error(f"{where}: not valid JSON after record {index} (text after the closing ']')")
                return
        pos = end
    raise error(f"{where}: not valid JSON at or after record {index} (the file ends inside the array)")


def _commas(buf: bytes, pos: int, end: int) -> Iterator[int]:
    i = buf.find(b",", pos, end)
    while i != -1:
        yield i
        i = buf.find(b",", i + 1, end)


# ---------------------------------------------------------------- YAML
class _DuplicateKey(Exception):
    """A mapping that gives one key twice (YAML would keep the last one without a word)."""


def _yaml_loader() -> type:
    import yaml  # lazy: yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader without timestamp resolution: `2024-01-01` stays the string it looks like; a key given twice
        in one mapping is refused (`name: lookup` then `name: skim` kept the last silently). Keys merged in with
        `<<` may be overridden, as YAML means them to be."""

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, int] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    line = key_node.start_mark.line + 1
                    try:
                        if key in seen:
                            raise _DuplicateKey(f"line {line}: the key {str(key)[:80]!r} is given twice (first at "
                                                f"line {seen[key]}); give each key once (YAML would keep the last one "
                                                "without a word)")
                        seen[key] = line
                    except TypeError:  # an unhashable key: the constructor's own error follows
                        continue
            return super().construct_mapping(node, deep=deep)

    Loader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    return Loader


_INTLIKE = re.compile(r"[-+]?[0-9][0-9a-fA-FxXoObB_:]*")


def _check_events(text: str, where: str, error: type[Exception], loader: type) -> None:
    """One pass over the YAML events (the parser does not recurse): tags, depth, int sizes, alias expansion."""
    import yaml  # lazy: yaml

    sizes: dict[str, int] = {}  # anchor -> nodes of its subtree, aliases expanded
    stack: list[list] = [[0, None]]  # [nodes so far, anchor] of each open collection
    for ev in yaml.parse(text, Loader=loader):
        if isinstance(ev, yaml.NodeEvent) and getattr(ev, "tag", None) is not None:
            line = ev.start_mark.line + 1 if ev.start_mark else "?"
            raise error(f"{where}: line {line}: the YAML tag {ev.tag} is not accepted (tags can change a value's "
                        "type); write the plain value")
        if isinstance(ev, yaml.AliasEvent):
            stack[-1][0] += sizes.get(ev.anchor, 1)
        elif isinstance(ev, yaml.ScalarEvent):
            if ev.style is None and len(ev.value) > MAX_INT_DIGITS and _INTLIKE.fullmatch(ev.value):
                raise error(f"{where}: line {ev.start_mark.line + 1}: a number of {len(ev.value):,} digits, more than "
                            f"the {MAX_INT_DIGITS:,} allowed; quote it if it is text")
            stack[-1][0] += 1
            if ev.anchor:
                sizes[ev.anchor] = 1
        elif isinstance(ev, yaml.CollectionStartEvent):
            stack.append([1, ev.anchor])
            if len(stack) - 1 > MAX_DEPTH:
                raise _too_deep(where, error)
        elif isinstance(ev, yaml.CollectionEndEvent):
            nodes, anchor = stack.pop()
            if anchor:
                sizes[anchor] = nodes
            stack[-1][0] += nodes
        if stack[0][0] + sum(s[0] for s in stack[1:]) > MAX_YAML_NODES:
            raise error(f"{where}: the YAML expands to more than {MAX_YAML_NODES:,} values (aliases included); "
                        "write the values out instead of nesting aliases")


def load_yaml(text: str, where: str, error: type[Exception], max_chars: int = CONFIG_CHARS) -> Any:
    """The value of the YAML document in `text`, bounded as the module says; anything else raises `error`."""
    import yaml  # lazy: yaml

    text = _size(text, where, error, max_chars)
    loader = _yaml_loader()
    try:
        _check_events(text, where, error, loader)
        value = yaml.load(text, Loader=loader)  # noqa: S506  (a SafeLoader subclass; no tags reach it)
    except yaml.YAMLError as exc:
        raise error(f"{where} is not valid YAML: {' '.join(str(exc).split())}") from None
    except _DuplicateKey as exc:
        raise error(f"{where}: {exc}") from None
    return check_tree(value, where, error)
