"""Plain progress lines in a log: one every 5%, with elapsed time and an ETA from this run's pace."""
from __future__ import annotations

import io

from memagent.progress import StepProgress, format_seconds


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_format_seconds():
    assert [format_seconds(s) for s in (0, 51, 204, 3725.4)] == ["0:00", "0:51", "3:24", "1:02:05"]


def test_plain_lines_every_five_percent_with_eta():
    out, clock = io.StringIO(), Clock()
    p = StepProgress("rl", 40, stream=out, clock=clock)  # a StringIO is not a terminal: plain lines
    for step in range(1, 41):
        clock.t += 2.5  # 2.5 s a step
        p.update(1, f"reward {step / 40:.2f}")
    p.close()
    lines = out.getvalue().splitlines()
    # 40 steps, 5% = 2 steps: a line at step 1, then at 2, 4, ..., 40
    assert len(lines) == 21
    assert lines[0] == "[rl] step 1/40 (2%) reward 0.03 | elapsed 0:02 | ETA 1:38"
    # step 10: 25 s elapsed, 2.5 s a step, 30 steps left -> 75 s
    assert "[rl] step 10/40 (25%) reward 0.25 | elapsed 0:25 | ETA 1:15" in lines
    assert lines[-1] == "[rl] step 40/40 (100%) reward 1.00 | elapsed 1:40 | ETA 0:00"


def test_resumed_run_counts_its_own_pace_and_info_only_updates_print_nothing():
    out, clock = io.StringIO(), Clock()
    p = StepProgress("sft", 100, done=50, stream=out, clock=clock)
    p.update(0, "loss 1.0")  # a figure changes, no step done: no line
    assert out.getvalue() == ""
    for _ in range(5):
        clock.t += 1.0
        p.update(1, "loss 0.5")
    # 5 steps in 5 s since the resume (the 50 before it not counted): 45 left -> 45 s
    assert out.getvalue().splitlines() == ["[sft] step 55/100 (55%) loss 0.5 | elapsed 0:05 | ETA 0:45"]
