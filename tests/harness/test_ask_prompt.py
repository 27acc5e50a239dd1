"""`memagent ask --prompt FILE`: a one-message prompt split by --prompt-split, answered like --document and
--question; a prompt the rule cannot split is one error line and exit code 2."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "serve"))  # tests/serve/serve_helpers.py (a top-level `serve` can be bench/serve.py)
from serve_helpers import SMALL, words

FLAGS = ["--device", "cpu", "--dtype", "float32", "--no-progress",
         *[x for k, v in SMALL.items() for x in (f"--{k.replace('_', '-')}", str(v))]]


def test_prompt_equals_document_and_question(run_cli, tiny_model_dir, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(words(150))
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(words(150) + "\nWhich river?\n")
    a = run_cli("ask", "--model", tiny_model_dir, "--prompt", prompt, "--prompt-split", "line", *FLAGS)
    b = run_cli("ask", "--model", tiny_model_dir, "--document", doc, "--question", "Which river?", *FLAGS)
    assert a[0] == 0 and b[0] == 0 and a[1] == b[1] and a[1].strip()


def test_bad_prompt_is_one_error_line(run_cli, tiny_model_dir, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(words(50) + "\nWhich river?")
    before = prompt.read_bytes()
    code, out, err = run_cli("ask", "--model", tiny_model_dir, "--prompt", prompt, *FLAGS)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("error: --prompt: the prompt has no blank line") and "--prompt-split" in err
    code, _, err = run_cli("ask", "--model", tiny_model_dir, "--prompt", prompt, "--question", "q?", *FLAGS)
    assert code == 2 and "do not combine it" in err
    code, _, err = run_cli("ask", "--model", tiny_model_dir, "--prompt", prompt, "--prompt-split", "para", *FLAGS)
    assert code == 2 and "choose one of: auto, messages, paragraph, line, separator:TEXT" in err
    code, _, err = run_cli("ask", "--model", tiny_model_dir, "--prompt", prompt, "--prompt-split", "messages", *FLAGS)
    assert code == 2 and "for chat requests" in err
    assert prompt.read_bytes() == before


def test_serve_refuses_an_unknown_rule_before_loading(run_cli, tmp_path):
    code, _, err = run_cli("serve", "--model", tmp_path / "no-model", "--state-dir", tmp_path / "s",
                           "--prompt-split", "sentence")
    assert code == 2 and err.startswith("error: unknown prompt split rule 'sentence'")


def test_a_missing_harness_package_is_a_clear_error():
    import pytest

    from memagent.errors import InputError
    from memagent.harness import require

    with pytest.raises(InputError, match=r"no_such_pkg is not installed; pip install 'memagent\[harness\]'"):
        require("no_such_pkg")
