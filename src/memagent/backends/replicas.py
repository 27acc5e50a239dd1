"""Which replica of a served model gets the next request: the pure routing rule, no I/O.

Replicas are numbered 0..n-1 (the order of `--base-url URL1,URL2,...`). The router keeps, per
replica, the requests outstanding on it and whether it is resting:

- `pick` sends a request to the replica with the fewest outstanding requests among those not
  resting and not excluded (the ones this request already failed on), lowest number first on a
  tie. When none qualifies it returns None, unless `probe` is set: then the resting replica whose
  rest ends soonest is tried (a request never waits for nothing).
- `finish(ok=False)` rests the replica: it is left out for `rest_seconds(k)` after its k-th
  failure in a row (doubling from `backoff`, capped at `max_backoff`, at least a Retry-After it
  was given); `finish(ok=True)` ends its run of failures. A rested replica comes back by itself
  once its rest is over.

Time is passed in (seconds of any monotonic clock), so every decision is a function of the calls.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable
from urllib.parse import urlsplit

from memagent.backends.base import BackendError


def rest_seconds(failures: int, backoff: float, max_backoff: float) -> float:
    """How long a replica rests after its `failures`-th failure in a row (1, 2, ...): backoff * 2^(failures-1),
    capped at max_backoff."""
    return min(max_backoff, backoff * 2 ** (max(failures, 1) - 1))


@dataclass
class ReplicaState:
    """One replica's counters. rest_until: the clock time before which it gets no request."""

    outstanding: int = 0
    failures: int = 0  # failures in a row
    rest_until: float = -math.inf
    sent: int = 0  # requests started on it, in all
    failed: int = 0  # of which failed (retryable failures only)


class Router:
    """Least-outstanding routing over `n` replicas with rest after failure (see the module docstring)."""

    def __init__(self, n: int, backoff: float = 1.0, max_backoff: float = 30.0) -> None:
        if n < 1:
            raise ValueError(f"a router needs at least one replica, got {n}")
        self.backoff, self.max_backoff = backoff, max_backoff
        self.replicas = [ReplicaState() for _ in range(n)]

    def resting(self, now: float) -> list[int]:
        """The replicas resting at time `now`."""
        return [i for i, r in enumerate(self.replicas) if r.rest_until > now]

    def pick(self, now: float, exclude: Iterable[int] = (), probe: bool = False) -> int | None:
        """The replica for the next request, or None (every replica resting or excluded, and no probe)."""
        skip = set(exclude)
        ready = [i for i, r in enumerate(self.replicas) if i not in skip and r.rest_until <= now]
        if ready:
            return min(ready, key=lambda i: (self.replicas[i].outstanding, i))
        if not probe:
            return None
        left = [i for i in range(len(self.replicas)) if i not in skip] or list(range(len(self.replicas)))
        return min(left, key=lambda i: (self.replicas[i].rest_until, self.replicas[i].outstanding, i))

    def start(self, i: int) -> None:
        """A request was sent to replica `i`."""
        self.replicas[i].outstanding += 1
        self.replicas[i].sent += 1

    def finish(self, i: int, now: float, ok: bool = True, retry_after: float | None = None) -> None:
        """The request on replica `i` ended: answered (`ok`, a client error counts as answered) or failed
        (refused, broken, timed out, 5xx or 429): then the replica rests."""
        r = self.replicas[i]
        r.outstanding -= 1
        if ok:
            r.failures = 0
            return
        r.failures += 1
        r.failed += 1
        rest = rest_seconds(r.failures, self.backoff, self.max_backoff)
        if retry_after is not None:
            rest = max(rest, min(retry_after, self.max_backoff))
        r.rest_until = max(r.rest_until, now + rest)


def split_base_urls(text: str) -> list[str]:
    """`URL1,URL2,...` as a list (spaces around commas allowed), each URL checked (`check_base_url`); an empty
    item or a URL given twice is an error."""
    urls = [u.strip().rstrip("/") for u in text.split(",")]
    if any(not u for u in urls):
        raise BackendError(f"--base-url {_shown(text)!r} has an empty item: give URL1,URL2,... with no empty entry")
    seen: set[str] = set()
    for u in urls:
        host = check_base_url(u)
        if u in seen:
            raise BackendError(f"--base-url names the replica at {host} (same URL) twice: give each replica once")
        seen.add(u)
    return urls


def check_base_url(url: str) -> str:
    """The host of `url`, once it is an http(s) URL with a host and, if given, a port in 1..65535 (a port over
    65535 or a broken [IPv6] literal is refused here, not when the first request is built)."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as e:  # urllib: "Port out of range 0-65535", "Invalid IPv6 URL", a bad [literal]
        raise BackendError(f"--base-url {_shown(url)!r} is not a valid URL ({e}); expected something like "
                           "http://localhost:8000/v1 (an IPv6 host in brackets: http://[::1]:8000/v1)") from None
    if parts.scheme not in ("http", "https") or not host:
        raise BackendError(f"base URL {_shown(url)!r} is not an http(s) URL; "
                           "expected something like http://localhost:8000/v1")
    if port == 0:
        raise BackendError(f"--base-url {_shown(url)!r}: port 0 is not a server's port; give one in 1..65535")
    return host


def _shown(url: str) -> str:
    """`url` as it may be printed: no user:password@, no query string."""
    return re.sub(r"//[^/?#,]*@", "//", url).split("?")[0]
