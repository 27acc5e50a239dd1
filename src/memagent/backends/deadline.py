"""A whole-request deadline for httpx: connect, send and every byte of the reply within one limit.

httpx's timeouts bound each network operation (one connect, one read, one write), so a server that
trickles a byte every half second never trips them and a request can last forever. Here every
socket operation of a request gets at most the time left before the request's deadline, and once
the deadline has passed the next operation fails at once with a timeout. The deadline is a
per-thread value set by `deadline(seconds)`: the sync client does its I/O on the calling thread,
so the deadline follows the request even onto a pooled keep-alive connection.

`DeadlineTransport` is httpx's own HTTP/1.1 transport over an httpcore pool built with the
deadline-aware network backend. It connects directly: proxy environment variables are not read.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

import httpcore
import httpx

_local = threading.local()


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Every socket operation of this thread, inside the block, ends within `seconds` from now."""
    _local.at = time.monotonic() + seconds
    try:
        yield
    finally:
        _local.at = None


def time_left(timeout: float | None, expired: type[Exception]) -> float | None:
    """`timeout` clamped to what is left of this thread's deadline; raises `expired` when none is left
    (no deadline set: `timeout` unchanged)."""
    at = getattr(_local, "at", None)
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise expired("the request's deadline has passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    """A network stream whose every read and write ends by the deadline."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, time_left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, time_left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        inner = self._inner.start_tls(ssl_context, server_hostname, time_left(timeout, httpcore.ConnectTimeout))
        return _Stream(inner)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.SyncBackend):
    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Any = None) -> httpcore.NetworkStream:
        timeout = time_left(timeout, httpcore.ConnectTimeout)
        return _Stream(super().connect_tcp(host, port, timeout, local_address, socket_options))


class DeadlineTransport(httpx.HTTPTransport):
    """httpx.HTTPTransport whose connections obey `deadline`."""

    def __init__(self, limits: httpx.Limits) -> None:
        super().__init__(limits=limits)
        # HTTPTransport takes no network backend; its pool (the attribute its handle_request uses)
        # is rebuilt with the same limits and the deadline-aware one
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(), max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections, keepalive_expiry=limits.keepalive_expiry,
            network_backend=_Backend())
