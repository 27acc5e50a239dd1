"""The measured side of the cost model: wall-clock of the MemAgent workflow against length.

The paper reports FLOPs only (`memagent.eval.flops`). Here one document of each length (filler
text cut to exactly that many tokens of the backend's tokenizer) is read by `MemoryAgent`, and
the time is fitted as seconds = a + b * chunks by least squares: the workflow's cost is linear in
the number of chunks, since each memory call has the same size. Chunks of one document are
serial, so this is also the latency a single document sees.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Sequence

from memagent.agent.workflow import AgentInput, MemoryAgent
from memagent.config import AgentConfig

__all__ = ["filler_document", "fit_linear", "measure_workflow_seconds"]

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


def filler_document(tokenizer: Any, tokens: int) -> str:
    """Filler text of `tokens` tokens once re-tokenised (a decode/encode round trip can merge
    tokens at the cut, so the cut is corrected until the count matches, or is off by one)."""
    unit = tokenizer(FILLER, add_special_tokens=False)["input_ids"]
    ids = unit * (2 * tokens // len(unit) + 2)
    n, best = tokens, None
    for _ in range(8):
        text = tokenizer.decode(ids[:n])
        count = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        if best is None or abs(count - tokens) < abs(best[1] - tokens):
            best = (text, count)
        if count == tokens:
            break
        n += tokens - count
    return best[0]


def fit_linear(xs: Sequence[float], ys: Sequence[float]) -> dict[str, float]:
    """Least squares y = intercept + slope * x, with r2."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys))
    return dict(intercept=intercept, slope=slope, r2=1 - ss_res / ss_tot if ss_tot else 1.0)


def measure_workflow_seconds(backend: Any, config: AgentConfig, lengths: Sequence[int], *, repeats: int = 1,
                             question: str = "What is the special magic number mentioned in the text?") -> dict[str, Any]:
    """Time `MemoryAgent.run` on one document per length; median over `repeats` runs.

    Returns {"rows": [{length, chunks, seconds, seconds_per_chunk}], "fit": {intercept, slope, r2}}
    where the fit is seconds against chunks.
    """
    agent = MemoryAgent(backend, config)
    rows = []
    for length in lengths:
        doc = filler_document(backend.tokenizer, length)
        times, chunks = [], 0
        for _ in range(repeats):
            t0 = time.perf_counter()
            (result,) = agent.run([AgentInput(question, doc, f"len{length}")])
            times.append(time.perf_counter() - t0)
            chunks = result.num_chunks
        seconds = statistics.median(times)
        rows.append(dict(length=length, chunks=chunks, seconds=seconds, seconds_per_chunk=seconds / max(1, chunks)))
    fit = fit_linear([r["chunks"] for r in rows], [r["seconds"] for r in rows]) if len(rows) > 1 else {}
    return dict(rows=rows, fit=fit)
