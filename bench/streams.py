"""The cost of a stream's standing questions (memagent.streams; docs/streams.md), with a fake instant backend, so
that what is measured is the stream's own work (tokenising events, SQLite, the chunk bookkeeping), not a model's.

1. Answer latency as the history grows (`--lengths`, tokens): a standing question that is current answers with the
   tail and the final call, so its latency should stay flat (target: largest / smallest <= 1.2; best of
   `--answers`, each after one more event), against an ad-hoc `memagent` read of the whole text (linear in the
   length; best of `--repeats`) and full-context (the text cut in the middle to `--window` tokens, one call: the
   prompt a model reads is capped by the window, though cutting still reads the whole text; best of `--repeats`).
   Each row also says how many tokens each way puts before a model for one answer (`*_tokens_read`): what decides
   a real model's latency, which the instant backend hides.
2. Append throughput (events/s) with 1, 10 and 100 standing questions on one stream: each event appended, then
   every question advanced (what `memagent serve`'s keeper does after an append).
3. Peak RSS of a fresh process that opens the stream and advances a new standing question over the whole history,
   at the smallest and the largest length (os.wait4): bounded (events are read a page at a time).

Run: .venv/bin/python bench/streams.py [--lengths 1000,16000,256000,1000000] [--repeats 3] [--window 131072]
Writes bench/results/streams.json (with the load average: what ran beside) and docs/img/streams.png; `--plot-only`
redraws the plot from the JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from common import RESULTS, WORK, table, write_result

C, M = 512, 64  # chunk and memory tokens
WINDOW = 131_072  # full-context's window (a 128K model's)
PLOT = Path(__file__).resolve().parent.parent / "docs" / "img" / "streams.png"
EVENT = "The user said that the meeting about the river project moved to room {i} and the budget is {j} euros."
QUESTION = "Where is the meeting now?"


class InstantBackend:
    """Replies at once: a short memory to a memory update, a boxed answer to the final call."""

    max_window = None

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.read = 0  # prompt tokens of every call so far (what a real model would read)
        self._ids = {t: tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("memo", "\\boxed{x}")}

    def prompt_length(self, prompt: str) -> int:
        return len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def generate(self, prompts: Sequence[str], params: Any) -> list[Any]:
        from memagent.backends.base import Generation

        self.read += sum(self.prompt_length(p) for p in prompts)
        return [Generation(t, list(self._ids[t])) for t in ("memo" if "<section>" in p else "\\boxed{x}"
                                                            for p in prompts)]


def _config() -> Any:
    from memagent.config import AgentConfig

    return AgentConfig(chunk_tokens=C, memory_tokens=M, answer_tokens=16)


def _build(path: Path, tokens: int, tokenizer: Any) -> int:
    """A stream of about `tokens` tokens of events; its number of events."""
    from memagent.streams import Stream

    per = len(tokenizer(f"[2026-01-01T00:00:00Z] user:\n{EVENT.format(i=1, j=1)}\n")["input_ids"])
    n = max(1, tokens // per)
    path.unlink(missing_ok=True)
    with Stream.create(path) as s:
        for start in range(0, n, 1000):
            s.append_many([dict(text=EVENT.format(i=i, j=i * 7 % 1000), time="2026-01-01")
                           for i in range(start, min(n, start + 1000))])
    return n


def full_context(s: Any, backend: Any, window: int) -> tuple[float, int]:
    """One full-context answer over the stream's text cut in the middle to `window`: (seconds, prompt tokens)."""
    from memagent.eval.baselines import context_budget, middle_truncate, render_baseline

    t0 = time.perf_counter()
    budget = context_budget(backend, QUESTION, 16, window)
    prompt = render_baseline(QUESTION, middle_truncate(s.text_blocks(), backend.tokenizer, budget).context)
    backend.generate([prompt], None)
    return time.perf_counter() - t0, backend.prompt_length(prompt)


def latency(lengths: list[int], repeats: int, answers: int, tokenizer: Any, window: int) -> list[dict[str, Any]]:
    from memagent.agent.registry import AgentInput, build_workflow, run_workflow
    from memagent.streams import Stream

    backend, config, rows = InstantBackend(tokenizer), _config(), []
    for tokens in lengths:
        path = WORK / f"stream_{tokens}.db"
        n = _build(path, tokens, tokenizer)
        with Stream.open(path) as s:
            q = s.standing(QUESTION, backend, config, "instant")
            t0 = time.perf_counter()
            q.advance()
            advance_s = time.perf_counter() - t0
            answer_s, adhoc_s = [], []
            for _ in range(answers):
                s.append("One more line arrives.")
                q.advance()  # current again (a watcher's work), then the answer alone is timed
                t0, read = time.perf_counter(), backend.read
                a = q.answer()
                answer_s.append(time.perf_counter() - t0)
                standing_read = backend.read - read
            for _ in range(repeats):
                t0, read = time.perf_counter(), backend.read
                run_workflow(build_workflow("memagent", backend, config), [AgentInput(QUESTION, s.text_blocks())])
                adhoc_s.append(time.perf_counter() - t0)
                adhoc_read = backend.read - read
            full = [full_context(s, backend, window) for _ in range(repeats)]
            history = sum(len(tokenizer(b, add_special_tokens=False)["input_ids"]) for b in s.text_blocks())
            rows.append(dict(tokens=tokens, events=n, chunks=q.state()["chunks"], answer_calls=a.calls,
                             answer_s=round(min(answer_s), 5), adhoc_s=round(min(adhoc_s), 4),
                             full_context_s=round(min(f for f, _ in full), 4), advance_all_s=round(advance_s, 3),
                             history_tokens=history, standing_tokens_read=standing_read, adhoc_tokens_read=adhoc_read,
                             full_context_tokens_read=full[0][1]))
        print(rows[-1], flush=True)
    return rows


def throughput(tokenizer: Any, events: int = 500) -> list[dict[str, Any]]:
    from memagent.streams import Stream

    backend, config, rows = InstantBackend(tokenizer), _config(), []
    for n_questions in (1, 10, 100):
        path = WORK / f"stream_q{n_questions}.db"
        path.unlink(missing_ok=True)
        with Stream.create(path) as s:
            qs = [s.standing(f"{QUESTION} ({k})", backend, config, "instant") for k in range(n_questions)]
            t0 = time.perf_counter()
            for i in range(events):
                s.append(EVENT.format(i=i, j=i))
                for q in qs:
                    q.advance()
            seconds = time.perf_counter() - t0
        rows.append(dict(questions=n_questions, events=events, events_per_s=round(events / seconds, 1)))
        print(rows[-1], flush=True)
    return rows


RSS_CHILD = """
import sys
sys.path.insert(0, sys.argv[2])
from streams import InstantBackend, _config, QUESTION
from memagent.backends.tiny import build_tokenizer
from memagent.streams import Stream
with Stream.open(sys.argv[1]) as s:
    s.standing(QUESTION + " (rss)", InstantBackend(build_tokenizer()), _config(), "instant").answer()
"""


def peak_rss(tokens: int) -> float:
    """Peak RSS (MB) of a fresh process that advances a new standing question over the stream of `tokens`."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    p = subprocess.Popen([sys.executable, "-c", RSS_CHILD, str(WORK / f"stream_{tokens}.db"),
                          str(Path(__file__).resolve().parent)], env=env)
    _, status, usage = os.wait4(p.pid, 0)
    if status != 0:
        raise SystemExit(f"the RSS child failed ({status})")
    return round(usage.ru_maxrss / 1024, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="1000,16000,256000,1000000")
    ap.add_argument("--repeats", type=int, default=3, help="ad-hoc reads per length (the best is kept)")
    ap.add_argument("--answers", type=int, default=30, help="standing answers per length (the best is kept)")
    ap.add_argument("--window", type=int, default=WINDOW, help="full-context's window (tokens)")
    ap.add_argument("--plot-only", action="store_true", help="redraw docs/img/streams.png from streams.json")
    args = ap.parse_args()
    if args.plot_only:
        plot(json.loads((RESULTS / "streams.json").read_text()))
        return
    from memagent.backends.tiny import build_tokenizer

    WORK.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    lengths = [int(x) for x in args.lengths.split(",")]
    lat = latency(lengths, args.repeats, args.answers, tokenizer, args.window)
    thr = throughput(tokenizer)
    rss = {str(lengths[0]): peak_rss(lengths[0]), str(lengths[-1]): peak_rss(lengths[-1])}
    flat = lat[-1]["answer_s"] / lat[0]["answer_s"]
    table([[r["tokens"], r["events"], r["chunks"], r["answer_s"], r["adhoc_s"], r["full_context_s"]] for r in lat],
          ["tokens", "events", "chunks", "answer s (standing)", "ad-hoc memagent s", "full-context s"])
    path = write_result("streams", dict(
        settings=dict(chunk_tokens=C, memory_tokens=M, backend="instant (fake)", repeats=args.repeats,
                      answers=args.answers, window=args.window),
        beside="the shared 2-core machine's other work (model training, test runs): see machine.load_avg",
        latency=lat, throughput=thr, peak_rss_mb=rss,
        checks=dict(answer_flat_ratio=round(flat, 3), answer_flat_target=1.2, answer_flat_met=flat <= 1.2,
                    rss_ratio=round(rss[str(lengths[-1])] / rss[str(lengths[0])], 3))))
    plot(json.loads(path.read_text()))


def plot(data: dict[str, Any], path: Path = PLOT) -> None:
    """docs/img/streams.png: seconds per answer (left) and tokens put before a model per answer (right) against the
    history's length, for a standing question, an ad-hoc memagent read and full-context."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["latency"]
    xs = [r["tokens"] for r in rows]
    ways = (("standing question", "answer_s", "standing_tokens_read"), ("ad-hoc memagent", "adhoc_s",
            "adhoc_tokens_read"), ("full-context", "full_context_s", "full_context_tokens_read"))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for label, secs, read in ways:
        left.plot(xs, [r[secs] for r in rows], marker="o", label=label)
        right.plot(xs, [r[read] for r in rows], marker="o", label=label)
    for ax, title in ((left, "seconds per answer (instant fake model)"), (right, "tokens a model reads per answer")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("history (tokens)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    right.axhline(data["settings"]["window"], color="grey", linestyle=":", label="full-context window")
    right.legend(fontsize=8)
    load = data["machine"]["load_avg"][0]
    fig.suptitle(f"bench/streams.py, {data['machine']['date']}, load {load:.1f} on {data['machine']['cores']} cores",
                 fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
