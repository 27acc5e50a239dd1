"""Issue 37, class 3: the harness entry points. Every bad `--model_args` (lm-eval) and `-M` (Inspect) is one
`error:` line and exit code 2, not a traceback; `batch_docs=abc` and `batch_docs=0` are refused (0 was silently
16); lm-eval's default `--device cuda:0` does not reach the memagent model (it runs on `auto`)."""
from __future__ import annotations

import sys

import pytest

from harness_helpers import BUDGETS, lm_eval_samples, write_task

GONE = "/nonexistent/memagent-model"


def _one_error(code, err: str, expected: str) -> None:
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and expected in lines[0], err[-3000:]


def _lm_eval(monkeypatch, capsys, tmp_path, *args: str):
    from memagent.harness.lm_eval_cli import main

    task = write_task(tmp_path / "task", n=1)
    monkeypatch.setattr(sys, "argv", ["lm_eval", "--model", "memagent", *args, "--tasks", "longqa_local",
                                      "--include_path", str(task), "--output_path", str(tmp_path / "out")])
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import lm_eval.__main__

    # lm-eval's log handler keeps the first test's captured stderr; in one process, log through pytest's
    monkeypatch.setattr(lm_eval.__main__, "setup_logging", lambda: None)
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("model_args, expected", [
    ("model={m},nope=1", "unknown memagent model argument(s) nope"),
    ("model={m},batch_docs=0", "batch_docs must be a positive integer, got 0"),
    (f"model={GONE},device=cpu", f"cannot load model '{GONE}'"),
])
def test_lm_eval_bad_model_args_are_one_line(model_args, expected, tiny_model_dir, tmp_path, monkeypatch, capsys):
    pytest.importorskip("lm_eval")
    code, err = _lm_eval(monkeypatch, capsys, tmp_path, "--model_args", model_args.format(m=tiny_model_dir))
    _one_error(code, err, expected)


def test_default_device_is_auto_for_memagent_only():
    from memagent.harness.lm_eval_cli import default_device

    assert default_device(["--model", "memagent", "--tasks", "t"]) == ["--model", "memagent", "--tasks", "t",
                                                                        "--device", "auto"]
    assert default_device(["--model=memagent"])[-2:] == ["--device", "auto"]
    for argv in (["--model", "memagent", "--device", "cpu"], ["--model", "memagent", "--device=cuda:1"],
                 ["--model", "hf", "--tasks", "t"], ["--model", "memagent", "--config", "c.yaml"]):
        assert default_device(argv) == argv


@pytest.mark.parametrize("args, expected", [
    (dict(chunk_tokens="abc"), "chunk_tokens must be a positive integer, got 'abc'"),
    (dict(temperature=-1), "temperature must be a finite number >= 0, got -1"),
    (dict(workflow="nope"), "unknown workflow 'nope'; valid workflows: memagent"),
    (dict(prompt_split="zzz"), "unknown prompt split rule 'zzz'"),
    (dict(batch_docs="abc"), "batch_docs must be a positive integer, got 'abc'"),
    (dict(batch_docs=0), "batch_docs must be a positive integer, got 0"),
    (dict(errors="ignore"), "errors must be one of strict, replace; got 'ignore'"),
    (dict(device=0), "device '0' is unknown"),
    (dict(dtype=True), "model argument dtype must be text, got True"),
])
def test_model_arguments_checked_before_the_model_loads(args, expected, tiny_model_dir):
    """The values both harnesses pass (lm-eval and Inspect parse `0` and `true` into numbers and booleans),
    named as given (`chunk_tokens`, not `--chunk-tokens`)."""
    from memagent.errors import MemAgentError
    from memagent.harness.runner import Harness

    with pytest.raises(MemAgentError) as e:
        Harness(str(tiny_model_dir), **{"device": "cpu", **args})
    assert expected in str(e.value)


@pytest.mark.slow
def test_lm_eval_without_device_runs_on_a_cpu_machine(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """lm-eval's own default (`cuda:0`) refused the run on a machine without a GPU; now it runs (auto)."""
    pytest.importorskip("lm_eval")
    import torch

    if torch.cuda.is_available():
        pytest.skip("the machine has a GPU: cuda:0 would have worked")
    code, err = _lm_eval(monkeypatch, capsys, tmp_path, "--model_args", f"model={tiny_model_dir},dtype=float32,"
                         f"{BUDGETS}", "--limit", "1", "--log_samples")
    assert code == 0, err[-3000:]
    results, samples = lm_eval_samples(tmp_path / "out")
    assert len(samples) == 1 and "exact_match,none" in results["results"]["longqa_local"]


TASK = '''
from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.scorer import includes
from inspect_ai.solver import generate


@task
def one():
    return Task(dataset=MemoryDataset([Sample(id=0, input="a b c\\n\\nQuestion: which?", target="a")]),
                solver=generate(), scorer=includes())
'''


@pytest.mark.parametrize("m_args, expected", [
    (["nope=1"], "unknown memagent model argument(s) nope"),
    (["batch_docs=0"], "batch_docs must be a positive integer, got 0"),
])
def test_inspect_bad_model_args_are_one_line(m_args, expected, tiny_model_dir, tmp_path, monkeypatch, capsys):
    pytest.importorskip("inspect_ai")
    from importlib.metadata import entry_points

    if not any(ep.name == "memagent" for ep in entry_points(group="inspect_ai")):
        pytest.skip("the memagent Inspect entry point is not installed (pip install -e .)")
    from inspect_ai._cli.main import inspect

    task = tmp_path / "one_task.py"
    task.write_text(TASK)
    monkeypatch.chdir(tmp_path)
    args = ["eval", task.name, "--model", f"memagent/{tiny_model_dir}", "--log-dir", str(tmp_path / "logs"),
            "--display", "none", "-M", "device=cpu", *[x for a in m_args for x in ("-M", a)]]
    try:
        inspect.main(args, prog_name="inspect")
        code = 0
    except SystemExit as e:
        code = e.code
    _one_error(code, capsys.readouterr().err, expected)
