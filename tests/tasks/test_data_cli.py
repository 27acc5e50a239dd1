"""`memagent data ...` and `memagent flops` through the command line."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from memagent.cli import app
from memagent.tasks.schema import DataError, read_samples

runner = CliRunner()


def test_data_ruler_hqa_docs_and_tokens(hotpot_file, tmp_path):
    out = tmp_path / "hqa.jsonl"
    args = ["data", "ruler-hqa", "--source", str(hotpot_file), "--num-docs", "20,40", "--samples", "3",
            "--seed", "7", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    first = out.read_bytes()
    samples = list(read_samples(out))
    assert [s["num_docs"] for s in samples] == [20] * 3 + [40] * 3 and samples[0]["num_tokens"] is None
    assert runner.invoke(app, args).exit_code == 0 and out.read_bytes() == first  # same seed, same bytes
    out2 = tmp_path / "hqa_tok.jsonl"
    result = runner.invoke(app, ["data", "ruler-hqa", "--source", str(hotpot_file), "--tokens", "3000",
                                 "--tokenizer", "tiny", "--samples", "2", "--out", str(out2)])
    assert result.exit_code == 0, result.output
    for s in read_samples(out2):
        assert abs(s["num_tokens"] - 3000) <= 60 and s["tokenizer"] == "tiny"


def test_data_ruler_task(tmp_path):
    out = tmp_path / "vt.jsonl"
    result = runner.invoke(app, ["data", "ruler", "--task", "vt", "--tokens", "2000", "--tokenizer", "tiny",
                                 "--samples", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert [s["task"] for s in read_samples(out)] == ["vt", "vt"]
    bad = runner.invoke(app, ["data", "ruler", "--task", "nope", "--tokens", "2000", "--tokenizer", "tiny",
                              "--out", str(out)])
    assert isinstance(bad.exception, DataError) and "choose one of" in str(bad.exception)
    bad = runner.invoke(app, ["data", "ruler", "--task", "vt", "--tokens", "20x", "--tokenizer", "tiny", "--out", str(out)])
    assert bad.exit_code == 2 and "comma-separated integers" in bad.output


def test_flops_json_and_plot(tmp_path):
    result = runner.invoke(app, ["flops", "--json", "--plot", str(tmp_path / "f.png")])
    assert result.exit_code == 0, result.output
    table = json.loads(result.output)
    ratios = [r["ratio"] for r in table["rows"]]
    assert table["model"]["name"] == "Qwen2.5-7B" and all(b > a for a, b in zip(ratios, ratios[1:]))
    assert (tmp_path / "f.png").stat().st_size > 10_000
    result = runner.invoke(app, ["flops", "--model", "qwen2.5-7b", "--model", "qwen2.5-14b", "--lengths", "8192,65536"])
    assert result.exit_code == 0 and "Qwen2.5-14B" in result.output and "64K" in result.output
