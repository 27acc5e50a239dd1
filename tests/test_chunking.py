import io
import math
import random

import pytest

from memagent.agent.chunking import DocumentError, iter_chunks, iter_text_blocks, iter_token_blocks


def _text(n_words: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    words = "the city of memory river música 東京 answer value  key\nfact, 12 345".split(" ")
    return " ".join(rng.choice(words) for _ in range(n_words))


def test_chunks_are_exactly_c_tokens_except_the_last(tiny_tokenizer):
    text = _text(3000)
    total = len(tiny_tokenizer(text, add_special_tokens=False)["input_ids"])
    chunks = list(iter_chunks(text, tiny_tokenizer, 100))
    assert len(chunks) == math.ceil(total / 100)
    assert all(len(c.token_ids) == 100 for c in chunks[:-1])
    assert 0 < len(chunks[-1].token_ids) <= 100
    assert [c.start_token for c in chunks] == [100 * i for i in range(len(chunks))]
    assert [c.index for c in chunks] == list(range(len(chunks)))


def test_blockwise_tokenisation_equals_whole_text(tiny_tokenizer):
    text = _text(5000, seed=1)
    whole = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    for block_chars in (97, 1000, 4096):
        streamed = [i for block in iter_token_blocks(text, tiny_tokenizer, block_chars=block_chars) for i in block]
        assert streamed == whole, block_chars
    chunks = list(iter_chunks(io.BytesIO(text.encode()), tiny_tokenizer, 64, block_chars=333))
    assert [i for c in chunks for i in c.token_ids] == whole


def test_text_without_spaces_still_streams(tiny_tokenizer):
    text = "漢字" * 20000  # no word boundary anywhere
    chunks = list(iter_chunks(text, tiny_tokenizer, 50, block_chars=5000))
    assert all(len(c.token_ids) <= 50 for c in chunks)
    assert "".join(c.text for c in chunks).count("漢") >= 19000  # cut characters may decode as U+FFFD


def test_sources_path_bytes_iterable_and_text_file(tiny_tokenizer, tmp_path):
    text = _text(800, seed=2)
    p = tmp_path / "doc.txt"
    p.write_text(text, encoding="utf-8")
    expected = [c.token_ids for c in iter_chunks(text, tiny_tokenizer, 37)]
    byte_blocks = [text.encode()[i : i + 101] for i in range(0, len(text.encode()), 101)]  # splits characters
    for source in (p, open(p, "rb"), open(p, encoding="utf-8"), iter(byte_blocks), [text[:500], text[500:]]):
        assert [c.token_ids for c in iter_chunks(source, tiny_tokenizer, 37, block_chars=211)] == expected


def test_invalid_utf8_names_the_byte_offset(tmp_path, tiny_tokenizer):
    p = tmp_path / "bad.txt"
    p.write_bytes(b"hello world " * 10 + b"\xff\xfe tail")
    with pytest.raises(DocumentError, match=r"byte 120"):
        list(iter_chunks(p, tiny_tokenizer, 10))
    chunks = list(iter_chunks(p, tiny_tokenizer, 10, errors="replace"))
    assert "\ufffd" in "".join(c.text for c in chunks)


def test_binary_and_missing_files_are_clear_errors(tmp_path, tiny_tokenizer):
    p = tmp_path / "bin.dat"
    p.write_bytes(b"abc\x00def")
    with pytest.raises(DocumentError, match="binary"):
        list(iter_text_blocks(p))
    with pytest.raises(DocumentError, match="not found"):
        list(iter_text_blocks(tmp_path / "nope.txt"))
    with pytest.raises(DocumentError, match="directory"):
        list(iter_text_blocks(tmp_path))


def test_empty_document_has_no_chunks(tiny_tokenizer):
    assert list(iter_chunks("", tiny_tokenizer, 10)) == []
    assert list(iter_chunks(io.BytesIO(b""), tiny_tokenizer, 10)) == []
