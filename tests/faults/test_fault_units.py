"""The pure pieces behind the fault handling: metrics trimming, checkpoint checks."""
from __future__ import annotations


import pytest
import torch
from safetensors.torch import save_file

from memagent.config import ConfigError
from memagent.rl.checkpoint.full import safetensors_problem
from memagent.rl.recipe import kept_records


def test_kept_records_drops_later_steps_and_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"step": 4, "rew')
    assert kept_records(path, 2) == (['{"step": 1}', '{"step": 2}'], False)
    path.write_text('{"step": 1}\n{"step": 2}\n')
    assert kept_records(path, 2) == (['{"step": 1}', '{"step": 2}'], True)  # nothing to drop: append only
    path.write_text('{"step": 1}\n{"step": 2}')  # whole but without its newline: kept, the file rewritten
    assert kept_records(path, 2) == (['{"step": 1}', '{"step": 2}'], False)
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ConfigError, match=r"metrics.jsonl:2 is not a metrics record"):
        kept_records(path, 2)
    assert kept_records(tmp_path / "absent.jsonl", 3) == ([], False)


def test_safetensors_length_is_checked_against_its_header(tmp_path):
    f = tmp_path / "w.safetensors"
    save_file({"a": torch.zeros(3, 4), "b": torch.ones(5)}, f)
    assert safetensors_problem(f) is None
    whole = f.read_bytes()
    f.write_bytes(whole[:-4])
    assert "truncated" in safetensors_problem(f)
    f.write_bytes(whole + b"\0")
    assert f"is {len(whole) + 1} bytes where its header says {len(whole)}" in safetensors_problem(f)
    f.write_bytes(whole[:5])
    assert "is truncated (5 bytes)" in safetensors_problem(f)
    f.write_bytes(b"\x04\0\0\0\0\0\0\0nope")
    assert "not a safetensors file" in safetensors_problem(f)


