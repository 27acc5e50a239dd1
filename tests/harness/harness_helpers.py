"""A local long-document QA task for the harness tests (no download), and `memagent ask`'s answers to it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "serve"))  # tests/serve/serve_helpers.py (a top-level `serve` can be bench/serve.py)
from serve_helpers import SMALL, words

SRC = Path(__file__).resolve().parents[2] / "src"
BUDGETS = ",".join(f"{k}={v}" for k, v in SMALL.items())
TASK = """task: longqa_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{document}}}}\\n\\nQuestion: {{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: []
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


def rows(n: int = 3) -> list[dict]:
    return [dict(document=words(120, seed=i), question=f"Which river is {i}?", answer=f"river{i}") for i in range(n)]


def prompt(row: dict) -> str:
    """The task's doc_to_text, by hand."""
    return f"{row['document']}\n\nQuestion: {row['question']}"


def write_task(folder: Path, n: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows(n)))
    (folder / "longqa.yaml").write_text(TASK.format(data=data))
    return folder


def env() -> dict:
    return dict(os.environ, PYTHONPATH=f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1",
                HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


def run(cmd: list[str], cwd: Path, extra_env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=cwd, env=dict(env(), **(extra_env or {})), capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    return p


def ask_answers(run_cli, model_dir: Path, folder: Path, n: int = 3) -> list[str]:
    """`memagent ask --prompt FILE` on each prompt of the task (greedy): the reply text a harness gets."""
    out = []
    for i, row in enumerate(rows(n)):
        f = folder / f"prompt{i}.txt"
        f.write_text(prompt(row))
        code, stdout, err = run_cli("ask", "--model", model_dir, "--prompt", f, "--device", "cpu", "--dtype",
                                    "float32", "--no-progress", *[x for k, v in SMALL.items()
                                                                  for x in (f"--{k.replace('_', '-')}", v)])
        assert code == 0, err
        text = stdout.rstrip("\n")
        if text.startswith("(no answer: "):
            text = text.split(") ", 1)[1] if ") " in text else ""
        out.append(text)
    return out


def lm_eval_samples(out_dir: Path) -> tuple[dict, list[dict]]:
    """(results JSON, samples) that lm-eval wrote under --output_path."""
    [results] = list(out_dir.rglob("results_*.json"))
    [samples] = list(out_dir.rglob("samples_longqa_local_*.jsonl"))
    return json.loads(results.read_text()), [json.loads(line) for line in samples.read_text().splitlines()]


__all__ = ["BUDGETS", "SMALL", "ask_answers", "lm_eval_samples", "prompt", "rows", "run", "sys", "write_task"]
