"""Issue 37 ("nothing lost, round 4"), classes 8 and 9, in the style of tests/test_bad_inputs.py: each case
ends in exit code 2, exactly one `error:` line, no traceback, every input file as it was (sha256), nothing
left behind. Class 8: left from the last round (ruler-hqa's filter flags, merge-lora over a truncated adapter
or on a full disk, flops' head count). Class 9: silent (`eval --methods nope --workflows skim` dropped `nope`;
`MKL_CBWR=garbage memagent demo` ran without a warning)."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
from pathlib import Path

import pytest
from tmpfs import mounted_tmpfs

from memagent.cli import run

HOTPOT = [{"_id": f"q{i}", "question": f"Where is item {i}?", "answer": f"place {i}",
           "supporting_facts": [[f"Title {i}", 0]],
           "context": [[f"Title {i}", [f"Item {i} lies in place {i}.", "It is old."]],
                       [f"Other {i}", ["Nothing here.", "Still nothing."]]]} for i in range(6)]


def _digests(*roots: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for root in roots for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = tmp_path_factory.mktemp("round4")
    (w / "hotpot.json").write_text(json.dumps(HOTPOT))
    toy = [{"id": f"t{i}", "task": "toy", "question": "What is k1?", "answers": ["v1"], "metric": "exact_match",
            "length": 2, "length_unit": "chunks", "context": "fact k1 v1"} for i in range(2)]
    (w / "toy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in toy))
    shape = dict(num_hidden_layers=2, hidden_size=10, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=16, vocab_size=32)
    (w / "uneven.json").write_text(json.dumps(shape))
    return w


@pytest.fixture(scope="module")
def lora(tmp_path_factory, tiny_model_dir):
    """A tiny base model (a copy) and its LoRA adapters as save_pretrained writes them; a copy of the adapters
    with the weights file cut in half."""
    pytest.importorskip("peft")
    import shutil

    from transformers import AutoModelForCausalLM

    from memagent.rl.config import LoraConfig
    from memagent.rl.lora import apply_lora

    w = tmp_path_factory.mktemp("lora")
    shutil.copytree(tiny_model_dir, w / "base")
    model = AutoModelForCausalLM.from_pretrained(w / "base")
    apply_lora(model, LoraConfig(r=2, alpha=4, target_modules=["q_proj", "v_proj"])).save_pretrained(w / "adapters")
    shutil.copytree(w / "adapters", w / "cut")
    weights = w / "cut" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return w


HQA = ["data", "ruler-hqa", "--source", "{w}/hotpot.json", "--num-docs", "4", "--samples", "1", "--out", "{w}/o.jsonl"]
CASES = [
    ("hqa-filter-temperature-nan", [*HQA, "--filter-temperature", "nan"],
     "--filter-temperature must be a finite number >= 0, got nan"),
    ("hqa-filter-top-p-inf", [*HQA, "--filter-top-p", "inf"], "--filter-top-p must be in (0, 1], got inf"),
    ("hqa-filter-base-url-no-openai", [*HQA, "--filter-model", "{m}", "--filter-base-url", "http://127.0.0.1:9/v1"],
     "--filter-base-url is for --filter-backend openai, not transformers"),
    ("hqa-filter-base-url-bad", [*HQA, "--filter-model", "{m}", "--filter-backend", "openai", "--filter-base-url",
                                 "http://h:99999/v1"], "is not a valid URL"),
    ("flops-heads-not-dividing-hidden", ["flops", "--model", "{w}/uneven.json"],
     "num_attention_heads (4) must divide hidden_size (10)"),
    ("merge-lora-truncated-adapter", ["merge-lora", "{l}/cut", "{w}/merged", "--base", "{l}/base"],
     "check that neither file is truncated"),
    ("eval-methods-nope-with-workflows", ["eval", "--model", "{m}", "--data", "{w}/toy.jsonl", "--out",
                                          "{w}/evalrun", "--methods", "nope", "--workflows", "skim", "--no-progress"],
     "--methods: unknown method(s) ['nope']"),
]


@pytest.mark.parametrize("args, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(args, message, world, lora, tiny_model_dir, capsys):
    before = _digests(world, lora, Path(tiny_model_dir))
    argv = [a.replace("{w}", str(world)).replace("{m}", str(tiny_model_dir)).replace("{l}", str(lora)) for a in args]
    code = run(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    lines = [line for line in (out + err).splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], (out, err)
    assert "Traceback" not in out + err
    assert _digests(world, lora, Path(tiny_model_dir)) == before
    assert not (world / "o.jsonl").exists() and not (world / "merged").exists() and not (world / "evalrun").exists()
    assert not [p for p in world.rglob("*.tmp")]


@pytest.fixture
def small_disk(tmp_path):
    """A 100 KiB tmpfs: the tiny merged model (about 150 KB) does not fit. Root only."""
    yield from mounted_tmpfs(tmp_path, "100k")


def test_merge_lora_on_a_full_disk_leaves_no_partial_folder(lora, small_disk, capsys):
    before = _digests(lora)
    code = run(["merge-lora", str(lora / "adapters"), str(small_disk / "merged"), "--base", str(lora / "base")])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert lines == [f"error: cannot write the merged model to {small_disk / 'merged'}: no space left on the device; "
                     "free some space or choose another OUT_DIR (nothing was left there)"], err
    assert "Traceback" not in err
    assert list(small_disk.iterdir()) == []  # no merged/ and no staging folder
    assert _digests(lora) == before


def test_merge_lora_writes_the_whole_folder_at_once(lora, tmp_path):
    """The merged model appears by one rename of a finished folder: it loads, and no staging folder stays."""
    from transformers import AutoModelForCausalLM

    assert run(["merge-lora", str(lora / "adapters"), str(tmp_path / "merged"), "--base", str(lora / "base")]) == 0
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "merged") is not None
    assert [p.name for p in tmp_path.iterdir()] == ["merged"]


def test_demo_warns_when_mkl_cbwr_is_not_a_branch(monkeypatch, tmp_path, caplog):
    import memagent.cli.train as train_cli

    seen = {}
    monkeypatch.setenv("MKL_CBWR", "garbage")
    monkeypatch.setattr(train_cli, "run_demo", lambda cfg: seen.setdefault("cbwr", os.environ.get("MKL_CBWR")))
    with caplog.at_level(logging.WARNING):
        assert run(["demo", "--quick", "--out", str(tmp_path / "d")]) == 0
    assert seen["cbwr"] == "garbage"  # the user's value is left, and said to be ignored by MKL
    [warning] = [r.getMessage() for r in caplog.records if "MKL_CBWR" in r.getMessage()]
    assert warning.startswith("MKL_CBWR='garbage' is not a branch MKL knows") and "not pinned" in warning


@pytest.mark.parametrize("value", ["AVX2", "avx512", "COMPATIBLE", "AVX2,STRICT", "AUTO"])
def test_demo_says_nothing_of_a_branch_mkl_knows(value, caplog):
    from memagent.demo.numerics import pin_mkl_branch

    env = {"MKL_CBWR": value}
    with caplog.at_level(logging.WARNING):
        assert pin_mkl_branch(env, {"avx2"}) == value
    assert not [r for r in caplog.records if "MKL_CBWR" in r.getMessage()]
