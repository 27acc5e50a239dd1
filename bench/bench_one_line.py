"""A 50 MB document of ONE line through `ask`'s reading path, against the same text in lines (issue 24, class 8).

The same words are written twice: once separated by spaces only (one line), once with every 12th space a
newline (the same size in bytes). Each runs in its own process through `MemoryAgent` (the chunker, the prompts,
the read-write loop) over the tiny model's tokenizer with a backend that replies at once, so the time measured
is the reading path's and not the model's; the peak RSS of each process shows that RAM does not grow with the
document. Writes bench/results/one_line.json.
Run: .venv/bin/python bench/bench_one_line.py [--mb 50]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import tiny_model, write_result

WORDS = ("river", "city", "the", "a", "house", "stone", "blue", "seven")


def make_document(path: Path, n_bytes: int, lines: bool) -> None:
    """`n_bytes` of the word cycle; with `lines`, every 12th separator is a newline (same size)."""
    with open(path, "w", encoding="utf-8") as fh:
        size = i = 0
        while size < n_bytes:
            piece = WORDS[i % len(WORDS)] + ("\n" if lines and i % 12 == 11 else " ")
            fh.write(piece)
            size += len(piece)
            i += 1


CHILD = """
import json, sys, time
from pathlib import Path
from transformers import AutoTokenizer
from memagent.agent.workflow import AgentInput, MemoryAgent
from memagent.backends.base import Generation
from memagent.config import AgentConfig

class Instant:
    def __init__(self, tok):
        self.tokenizer, self.max_window = tok, 32768
    def prompt_length(self, prompt):
        return len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
    def generate(self, prompts, params):
        ids = self.tokenizer("memo", add_special_tokens=False)["input_ids"]
        return [Generation(text="memo", token_ids=ids, logprobs=None, prompt_token_ids=[]) for _ in prompts]

tok = AutoTokenizer.from_pretrained(sys.argv[1])
agent = MemoryAgent(Instant(tok), AgentConfig(), progress=False)
t = time.perf_counter()
r = agent.run([AgentInput("What is kept?", Path(sys.argv[2]), "0")])[0]
print(json.dumps(dict(seconds=round(time.perf_counter() - t, 2), chunks=r.num_chunks)))
"""


def run_one(model: Path, doc: Path, timeout: float) -> dict:
    """Time and peak RSS of one child process reading `doc`."""
    t = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-c", CHILD, str(model), str(doc)], capture_output=True, text=True,
                             timeout=timeout, check=True).stdout
        result = json.loads(out.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        result = dict(seconds=None, chunks=None, timed_out=timeout)
    result["wall_seconds"] = round(time.perf_counter() - t, 2)
    result["max_rss_mb_of_children"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=50.0)
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    model = tiny_model()
    n_bytes = int(args.mb * 1_000_000)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, lines in (("one_line", False), ("lines", True)):
            doc = Path(tmp) / f"{name}.txt"
            make_document(doc, n_bytes, lines)
            results[name] = run_one(model, doc, args.timeout)
            doc.unlink()
            print(name, results[name], flush=True)
    write_result("one_line", dict(mb=args.mb, results=results,
                                  note="MemoryAgent over the tiny tokenizer, instant replies; max RSS is the "
                                       "largest child so far (cumulative maximum)"))


if __name__ == "__main__":
    main()
