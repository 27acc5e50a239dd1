"""Progress on stderr for long work: a rich bar on a terminal, plain lines in a log.

When stderr is not a terminal (`make demo > log 2>&1`, CI, nohup) a bar would print nothing useful, so
`StepProgress` writes one plain line every `every` percent instead:

    [rl] step 40/200 (20%) reward 0.91 loss 0.0213 | elapsed 0:51 | ETA 3:24

The ETA is the mean time per step of this run (steps done before a resume are not counted) times the steps left.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import Callable, TextIO

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

__all__ = ["CallRate", "StepProgress", "call_figures", "format_seconds", "quiet_libraries"]


def quiet_libraries() -> None:
    """No bars or chatter from the libraries in this process (a command's, a Ray actor's): transformers' weight
    loading, the tokenizers' fork warning, bm25s' log of every index build."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs every index build at DEBUG
    try:
        from transformers.utils import logging as hf_logging  # lazy: transformers

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass


def format_seconds(seconds: float) -> str:
    """0:51, 3:24, 1:02:05."""
    s = max(0, int(round(seconds)))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def call_figures(calls_done: int, in_flight: int, seconds: float) -> str:
    """The model-call figures of a run's progress line: "calls 120 (14.3/s), 8 in flight"."""
    rate = f"{calls_done / seconds:.1f}/s" if seconds > 0 else "?/s"
    return f"calls {calls_done} ({rate}), {in_flight} in flight"


class CallRate:
    """`call_figures` from the time this object was made (a run's start)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock, self._t0 = clock, clock()

    def info(self, calls_done: int, in_flight: int) -> str:
        return call_figures(calls_done, in_flight, self._clock() - self._t0)


class StepProgress:
    """Progress over `total` steps (`done` of them finished already, e.g. after a resume)."""

    def __init__(self, what: str, total: int, done: int = 0, unit: str = "step", every: float = 5.0,
                 stream: TextIO | None = None, fancy: bool | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what, self.total, self.done, self.unit, self.every = what, max(0, total), done, unit, every
        self.info = ""
        self._stream = stream if stream is not None else sys.stderr
        self._clock = clock
        self._t0, self._done0 = clock(), done
        self._last_pct = -1.0 if done == 0 else self._pct() - self._pct() % every
        if fancy is None:
            fancy = bool(getattr(self._stream, "isatty", lambda: False)())
        self._bar = self._start_bar() if fancy else None

    def _pct(self) -> float:
        return 100.0 * self.done / self.total if self.total else 100.0

    def _start_bar(self):  # a rich bar; only on a terminal
        bar = Progress(TextColumn(f"{self.what} {self.unit}"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                       console=Console(file=self._stream))
        self._task = bar.add_task(self.what, total=self.total, completed=self.done, info="")
        bar.start()
        return bar

    def update(self, advance: int = 1, info: str | None = None) -> None:
        """`advance` more steps done; `info` (e.g. "reward 0.91 loss 0.02") replaces the shown figures."""
        self.done += advance
        if info is not None:
            self.info = info
        if self._bar is not None:
            self._bar.update(self._task, advance=advance, info=self.info)
            return
        if advance == 0:
            return  # figures only: shown with the next step's line
        pct = self._pct()
        if self.done >= self.total or pct >= self._last_pct + self.every or self._last_pct < 0:
            self._last_pct = pct - (pct % self.every) if self.done < self.total else 100.0
            self._stream.write(self.line() + "\n")
            self._stream.flush()

    def line(self) -> str:
        """The plain progress line for the current state."""
        elapsed = self._clock() - self._t0
        ran = self.done - self._done0
        left = self.total - self.done
        eta = format_seconds(elapsed / ran * left) if ran > 0 else "?"
        info = f" {self.info}" if self.info else ""
        return (f"[{self.what}] {self.unit} {self.done}/{self.total} ({self._pct():.0f}%){info} | "
                f"elapsed {format_seconds(elapsed)} | ETA {eta}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
