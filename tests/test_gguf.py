"""GGUF files: the header reader, `memagent model import` and `--model FILE.gguf` on bad input (fast: no model is
converted here; the real conversion is tests/real/)."""
from __future__ import annotations

import struct
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from memagent.backends.gguf import GGUFError, check_gguf, is_gguf, read_header, resolve_model  # noqa: E402


def write_gguf(path, arch="llama", tensor_rows=4):
    """A small valid GGUF file: a few header fields and one float32 tensor of shape (tensor_rows, 8)."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(256)
    w.add_name("test model")
    w.add_tensor("token_embd.weight", np.arange(tensor_rows * 8, dtype=np.float32).reshape(tensor_rows, 8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_header_reads_fields_and_the_tensor_extent(tmp_path):
    path = write_gguf(tmp_path / "m.gguf")
    header = read_header(path)
    assert header["general.architecture"] == "llama"
    assert header["llama.context_length"] == 256
    assert header["general.name"] == "test model"
    assert header["GGUF.tensor_count"] == 1
    # the one tensor's 32 float32 values end the file: data_end is its size exactly
    assert header["GGUF.data_end"] == path.stat().st_size
    assert is_gguf(path) and not is_gguf(tmp_path)


def test_truncated_file_is_refused_before_conversion(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", tensor_rows=64)
    data = path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:-100])  # the tensor data cut short
    with pytest.raises(GGUFError, match="truncated: its tensors need"):
        read_header(tmp_path / "cut.gguf")
    (tmp_path / "head.gguf").write_bytes(data[:30])  # cut inside the header
    with pytest.raises(GGUFError, match="truncated: its header ends early"):
        read_header(tmp_path / "head.gguf")


def test_damaged_lengths_are_refused(tmp_path):
    # magic, version 3, 0 tensors, 1 key whose length field claims 2**40 bytes
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 1 << 40))
    with pytest.raises(GGUFError, match="damaged"):
        read_header(tmp_path / "bad.gguf")
    (tmp_path / "v9.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 9, 0, 0))
    with pytest.raises(GGUFError, match="version 9"):
        read_header(tmp_path / "v9.gguf")


def test_unsupported_architecture(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", arch="rwkv6")
    with pytest.raises(GGUFError, match="architecture 'rwkv6'.*supported: .*llama"):
        check_gguf(path)


def test_folder_with_a_gguf_and_no_config_names_the_way_out(tmp_path):
    write_gguf(tmp_path / "m.gguf")
    with pytest.raises(GGUFError, match=r"holds m.gguf but no config.json.*memagent model import"):
        resolve_model(str(tmp_path))
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def _one_error(code, out, err):
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("case", ["random", "truncated", "architecture", "folder", "not-installed"])
def test_model_import_bad_input_is_one_line_and_writes_nothing(case, tmp_path, run_cli, monkeypatch):
    src = tmp_path / "m.gguf"
    if case == "random":
        src.write_bytes(bytes(range(256)) * 4)
    elif case == "truncated":
        data = write_gguf(tmp_path / "full.gguf", tensor_rows=64).read_bytes()
        src.write_bytes(data[: len(data) // 2])
    elif case == "architecture":
        write_gguf(src, arch="rwkv6")
    elif case == "folder":
        (tmp_path / "folder").mkdir()
        write_gguf(tmp_path / "folder" / "m.gguf")
        src = tmp_path / "folder"
    else:
        write_gguf(src)
        monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf raises ImportError
    out = tmp_path / "out"
    before = sorted(p.name for p in tmp_path.rglob("*"))
    line = _one_error(*run_cli("model", "import", src, "--out", out))
    expected = {"random": "not a GGUF file", "truncated": "truncated", "architecture": "architecture 'rwkv6'",
                "folder": "is not a file", "not-installed": "needs the `gguf` package"}[case]
    assert expected in line
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_ask_on_a_folder_holding_only_a_gguf(tmp_path, run_cli):
    write_gguf(tmp_path / "m.gguf")
    (tmp_path / "doc.txt").write_text("some text")
    line = _one_error(*run_cli("ask", "--model", tmp_path, "--document", tmp_path / "doc.txt", "--question", "q?"))
    assert "no config.json" in line and "--model" in line


def test_ask_on_an_unsupported_gguf_file(tmp_path, run_cli, monkeypatch):
    monkeypatch.setenv("MEMAGENT_CACHE", str(tmp_path / "cache"))
    write_gguf(tmp_path / "m.gguf", arch="rwkv6")
    (tmp_path / "doc.txt").write_text("some text")
    line = _one_error(*run_cli("ask", "--model", tmp_path / "m.gguf", "--document", tmp_path / "doc.txt",
                               "--question", "q?"))
    assert "architecture 'rwkv6'" in line
    assert not any((tmp_path / "cache").rglob("*.json"))
