"""Prometheus text metrics of the service (exposition format 0.0.4), without a client library:
requests by route and status, model calls and tokens, queue length, and latency histograms."""
from __future__ import annotations

import threading
from bisect import bisect_left
from typing import Callable

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class Histogram:
    """Cumulative-bucket histogram (seconds)."""

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)  # the last: +Inf
        self.total = 0.0
        self.n = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(BUCKETS, seconds)] += 1
        self.total += seconds
        self.n += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        out, acc = [], 0
        sep = "," if labels else ""
        for le, c in zip([*map(str, BUCKETS), "+Inf"], self.counts):
            acc += c
            out.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {acc}')
        lab = f"{{{labels}}}" if labels else ""
        return out + [f"{name}_sum{lab} {self.total:.6f}", f"{name}_count{lab} {self.n}"]


class Metrics:
    """Counters and histograms, thread-safe; `gauges` are read when rendered."""

    def __init__(self, gauges: dict[str, Callable[[], float]] | None = None) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.request_seconds: dict[str, Histogram] = {}
        self.calls = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.call_seconds = Histogram()
        self.gauges = gauges or {}

    def request(self, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[(route, status)] = self.requests.get((route, status), 0) + 1
            self.request_seconds.setdefault(route, Histogram()).observe(seconds)

    def model_call(self, n_prompts: int, seconds: float) -> None:
        with self._lock:
            self.calls += n_prompts
            self.call_seconds.observe(seconds)

    def tokens(self, prompt: int, completion: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt
            self.completion_tokens += completion

    def render(self) -> str:
        with self._lock:
            lines = ["# TYPE memagent_requests_total counter"]
            lines += [f'memagent_requests_total{{route="{r}",status="{s}"}} {n}'
                      for (r, s), n in sorted(self.requests.items())]
            lines.append("# TYPE memagent_request_seconds histogram")
            for r, h in sorted(self.request_seconds.items()):
                lines += h.lines("memagent_request_seconds", f'route="{r}"')
            lines += ["# TYPE memagent_model_calls_total counter", f"memagent_model_calls_total {self.calls}",
                      "# TYPE memagent_prompt_tokens_total counter",
                      f"memagent_prompt_tokens_total {self.prompt_tokens}",
                      "# TYPE memagent_completion_tokens_total counter",
                      f"memagent_completion_tokens_total {self.completion_tokens}",
                      "# TYPE memagent_model_call_seconds histogram",
                      *self.call_seconds.lines("memagent_model_call_seconds")]
        for name, read in sorted(self.gauges.items()):
            lines += [f"# TYPE {name} gauge", f"{name} {read()}"]
        return "\n".join(lines) + "\n"
