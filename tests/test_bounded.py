"""The bounded JSON/YAML reader and the one UTF-8 rule, on hand-made inputs: each limit passes exactly at
its value and fails one past it; bombs fail fast in bounded memory."""
from __future__ import annotations

import io
import json
import time
import tracemalloc

import pytest

from memagent.bounded import MAX_DEPTH, MAX_INT_DIGITS, MAX_YAML_NODES, iter_json_array, load_yaml, loads_json
from memagent.errors import InputError
from memagent.text import check_argv


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def array_items(data: bytes, block: int = 7) -> list:
    """The parsed items of a JSON array, read in tiny blocks (every boundary case of the splitter)."""
    return [loads_json(raw.decode(), f"item {i}", InputError)
            for i, raw in iter_json_array(io.BytesIO(data), "f.json", InputError, block=block)]


# ---------------------------------------------------------------- depth
def test_json_depth_at_the_limit_passes_one_more_fails():
    assert loads_json(nested(MAX_DEPTH), "f", InputError) is not None
    with pytest.raises(InputError, match=f"f: nested more than {MAX_DEPTH} levels deep"):
        loads_json(nested(MAX_DEPTH + 1), "f", InputError)
    deep_in_object = '{"a": ' + nested(MAX_DEPTH) + "}"
    with pytest.raises(InputError, match="nested more than"):
        loads_json(deep_in_object, "f", InputError)


@pytest.mark.parametrize("depth", [5_000, 100_000])
def test_a_very_deep_record_fails_fast_in_bounded_memory(depth):
    text = '{"question": "q", "context": ' + nested(depth) + "}"
    for read in (lambda: loads_json(text, "f", InputError), lambda: array_items(("[" + text + "]").encode(), 1 << 16)):
        tracemalloc.start()
        t0 = time.perf_counter()
        with pytest.raises(InputError, match="nested more than"):
            read()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert time.perf_counter() - t0 < 2 and peak < 20 * len(text) + (1 << 20)


def test_yaml_depth_at_the_limit_passes_one_more_fails():
    assert load_yaml("a: " + nested(MAX_DEPTH - 1), "c.yaml", InputError) == {"a": json.loads(nested(MAX_DEPTH - 1))}
    with pytest.raises(InputError, match="c.yaml: nested more than"):
        load_yaml("a: " + nested(MAX_DEPTH), "c.yaml", InputError)
    with pytest.raises(InputError, match="nested more than"):
        load_yaml("a: " + nested(100_000), "c.yaml", InputError)


# ---------------------------------------------------------------- numbers
def test_integers_at_the_digit_limit_pass_one_more_fails():
    assert loads_json("9" * MAX_INT_DIGITS, "f", InputError) == int("9" * MAX_INT_DIGITS)
    assert loads_json(f'{{"id": -{"1" * MAX_INT_DIGITS}}}', "f", InputError)["id"] < 0
    assert MAX_INT_DIGITS == 4300
    for text in ("9" * (MAX_INT_DIGITS + 1), '{"length": ' + "1" * 10_000 + "}"):
        with pytest.raises(InputError, match=f"more than the {MAX_INT_DIGITS:,} allowed"):
            loads_json(text, "f", InputError)
    assert loads_json('"' + "1" * 10_000 + '"', "f", InputError) == "1" * 10_000  # digits in a string are text
    with pytest.raises(InputError, match="an integer of 10,000 digits"):
        array_items(b'[{"index": ' + b"7" * 10_000 + b"}]")
    assert load_yaml("seed: " + "9" * MAX_INT_DIGITS, "c", InputError)["seed"] == int("9" * MAX_INT_DIGITS)
    with pytest.raises(InputError, match="a number of 10,000 digits"):
        load_yaml("seed: " + "9" * 10_000, "c", InputError)
    with pytest.raises(InputError, match="a number of 4,301 digits"):
        load_yaml("seed: " + "9" * (MAX_INT_DIGITS + 1), "c", InputError)


def test_the_digit_bound_holds_where_python_has_none(monkeypatch):
    import sys

    monkeypatch.setattr(sys, "get_int_max_str_digits", lambda: 0)  # then the reader's own hook counts digits
    assert loads_json("[" + "1" * MAX_INT_DIGITS + "]", "f", InputError)[0] > 0
    with pytest.raises(InputError, match="an integer of 4,301 digits, more than the 4,300 allowed"):
        loads_json("[" + "1" * (MAX_INT_DIGITS + 1) + "]", "f", InputError)
    assert load_yaml("seed: '" + "9" * 10_000 + "'", "c", InputError)["seed"] == "9" * 10_000


# ---------------------------------------------------------------- YAML tags, dates, aliases
@pytest.mark.parametrize("text", ["seed: !!float 3", "x: !!binary aGk=", "x: !!python/object:os.system {}",
                                  "x: !!timestamp 2024-01-01", "x: !custom 1", "x: !!set {a, b}"])
def test_explicit_yaml_tags_are_refused(text):
    with pytest.raises(InputError, match=r"c.yaml: line 1: the YAML tag .* is not accepted"):
        load_yaml(text, "c.yaml", InputError)


def test_dates_stay_strings_and_plain_values_keep_their_types():
    assert load_yaml("d: 2024-01-01\nt: 2001-12-14t21:59:43.10-05:00\nn: 3\nf: 1.5e-3\nb: true\nz: null",
                     "c", InputError) == {"d": "2024-01-01", "t": "2001-12-14t21:59:43.10-05:00", "n": 3,
                                          "f": 0.0015, "b": True, "z": None}


def test_an_alias_bomb_is_refused_before_it_is_built():
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):  # 10**9 values once expanded
        lines.append(f"{chr(97 + i)}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}"] * 10) + "]")
    t0 = time.perf_counter()
    with pytest.raises(InputError, match=f"expands to more than {MAX_YAML_NODES:,} values"):
        load_yaml("\n".join(lines), "c.yaml", InputError)
    assert time.perf_counter() - t0 < 2
    small = "a: &a [1, 2]\nb: *a\nc: {<<: {k: 1}, j: 2}"  # a few aliases and a merge key are fine
    assert load_yaml(small, "c", InputError) == {"a": [1, 2], "b": [1, 2], "c": {"k": 1, "j": 2}}


# ---------------------------------------------------------------- BOM, size, text
def test_a_leading_bom_is_accepted_and_stripped():
    assert loads_json('\ufeff{"a": 1}', "f", InputError) == {"a": 1}
    assert load_yaml("\ufeffa: 1", "c", InputError) == {"a": 1}
    assert array_items(b'\xef\xbb\xbf[{"a": 1}, 2]') == [{"a": 1}, 2]


def test_size_limits():
    assert loads_json('"abcd"', "f", InputError, max_chars=6) == "abcd"
    with pytest.raises(InputError, match="f: 7 characters, more than the 6 allowed"):
        loads_json('"abcde"', "f", InputError, max_chars=6)
    with pytest.raises(InputError, match="record 0 is over 10 bytes"):
        list(iter_json_array(io.BytesIO(b'["' + b"x" * 40 + b'"]'), "f.json", InputError, max_item=10, block=4))


def test_lone_surrogates_are_refused_naming_the_field_and_pairs_pass():
    with pytest.raises(InputError, match=r"f:3, field 'question': holds text that is not valid UTF-8 "
                                         r"\(a lone surrogate U\+D800 at character 4\)"):
        loads_json('{"id": "a", "question": "who \\ud800 is"}', "f:3", InputError)
    with pytest.raises(InputError, match=r"field 'memory'.*U\+DFFF"):
        loads_json('{"memory": {"notes": ["ok", "\\udfff"]}}', "f", InputError)
    with pytest.raises(InputError, match=r"field '\\udc00'"):  # a key is text too
        loads_json('{"\\udc00": 1}', "f", InputError)
    assert loads_json('{"q": "\\ud83d\\ude00"}', "f", InputError) == {"q": "\U0001f600"}
    with pytest.raises(InputError, match="U\\+D800"):
        load_yaml('q: "\\ud800"', "c", InputError)


def test_argv_that_is_not_utf8_names_its_flag():
    argv = ["ask", "--question", "who \udced\udca0\udc80 is"]  # os.fsdecode(b"who \xed\xa0\x80 is")
    assert check_argv(argv) == ("--question holds text that is not valid UTF-8 (the byte 0xed at character 4 is not "
                                "UTF-8); pass UTF-8 text (check the encoding of the terminal or the script)")
    assert check_argv(["--document=\udcff"]).startswith("--document holds text")
    assert check_argv(["ask", "x\ud800"]).startswith("argument 2 holds text that is not valid UTF-8 (a lone surrogate")
    assert check_argv(["ask", "--question", "caf\u00e9 \U0001f600"]) is None


# ---------------------------------------------------------------- the array splitter
@pytest.mark.parametrize("block", [1, 3, 7, 1 << 16])
def test_the_array_splitter_reads_what_json_reads(block):
    value = [{"a": "x, ] } \\" + '" [', "b": [1, [2, {"c": None}]]}, 3, "s,t", [], {}, -1.5e3, True, None,
             "\U0001f600" * 3]
    data = json.dumps(value, ensure_ascii=False).encode()
    assert array_items(data, block) == value
    assert array_items(b"[]", block) == []
    for bad, says in ((b'[1, {"a": ', "at or after record 1"), (b"[1] 2", "text after the closing"),
                      (b'{"a": 1}', "not a JSON array"), (b'[1, "abc', "at or after record 1"), (b"[1,,2]", "item 1")):
        with pytest.raises(InputError, match=says):
            array_items(bad, block)
