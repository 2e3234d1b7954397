"""Fetch every target's /metrics concurrently with libcurl's multi interface (pycurl).

One round is one curl multi handle: every transfer (connect, request, response, chunked
decoding, redirects, timeouts) runs in libcurl's C code, driven by an epoll selector, so a
slow target delays no other and Python only sets up each transfer and reads its result. It
costs less than half the CPU per target of aiohttp and a quarter of httpx on the same
requests (bench/bench_prometheus.py; docs/benchmarks.md). As Prometheus does, scrapes
never go through a proxy from the environment, and connections stay open from one round to
the next (_Connections).
"""

from __future__ import annotations

import codecs
import errno
import selectors
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import certifi
import pycurl

from kneepoint.clock import Clock, system_clock
from kneepoint.config import Target
from kneepoint.secrets import revealed, scrub

# curl's error codes by number, for messages: 18 -> "partial file".
_CURL_ERRORS = {
    getattr(pycurl, name): name[2:].lower().replace("_", " ")
    for name in dir(pycurl)
    if name.startswith("E_") and isinstance(getattr(pycurl, name), int)
}
_HTTP = pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS
_CA_BUNDLE = certifi.where()


@dataclass(frozen=True)
class Fetched:
    target: Target
    started_at: float
    duration: float
    body: str | None
    error: str | None


@dataclass
class _Transfer:
    """One target's transfer: its curl handle and what came back."""

    target: Target
    started_at: float
    curl: pycurl.Curl | None = None
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    stopped: str | None = None  # "size": cut short for its size (max_bytes)
    curl_error: tuple[int, str] | None = None
    error: str | None = None  # set up failed

    def write(self, chunk: bytes) -> int | None:
        """curl's write callback: keep the chunk, or stop the transfer (return 0)."""
        self.size += len(chunk)
        if self.size > self.target.max_bytes:
            self.stopped = "size"
            return 0
        self.chunks.append(chunk)
        return None

    def result(self) -> Fetched:
        duration = self.curl.getinfo(pycurl.TOTAL_TIME) if self.curl is not None else 0.0
        error = self.error or self._error()
        if error is not None:
            return Fetched(self.target, self.started_at, duration, None, error)
        assert self.curl is not None
        body = b"".join(self.chunks).decode(
            _encoding(self.curl.getinfo(pycurl.CONTENT_TYPE)), errors="replace"
        )
        return Fetched(self.target, self.started_at, duration, body, None)

    def _error(self) -> str | None:
        """Why this target could not be read, in one sentence; never its URL unredacted or a
        header's value."""
        assert self.curl is not None
        target, where = self.target, str(self.target.url)  # redacted (redact_url)
        status = self.curl.getinfo(pycurl.RESPONSE_CODE)
        answered = self.curl_error is None or self.stopped is not None
        if (answered or status >= 400) and status != 200:
            return f"HTTP {status} from {where}"
        if answered and "html" in (self.curl.getinfo(pycurl.CONTENT_TYPE) or ""):
            return f"{where} answered with an HTML page, not metrics"
        if self.stopped == "size":
            return f"response from {where} exceeds {target.max_bytes} bytes"
        if self.curl_error is None:
            return None
        number, message = self.curl_error
        if number == pycurl.E_OPERATION_TIMEDOUT:
            return f"timed out after {target.timeout:g}s"
        if number in (pycurl.E_COULDNT_CONNECT, pycurl.E_COULDNT_RESOLVE_HOST):
            if self.curl.getinfo(pycurl.OS_ERRNO) == errno.ECONNREFUSED:
                return f"cannot connect to {where}: connection refused"
            return f"cannot connect to {where}: {_reason(message, target)}"
        kind = _CURL_ERRORS.get(number, f"curl error {number}")
        return f"{kind} from {where}: {_reason(message, target)}"


class _Connections:
    """Connections kept open from one round to the next (HTTP keep-alive), as Prometheus
    keeps its own: a round then costs no TCP connect, accept and close per target, nor a TLS
    handshake, on either side. libcurl keeps them in a share handle's connection cache
    (with its DNS cache and TLS sessions), which one thread at a time may use: a round that
    finds it busy (two rounds at once, in tests or a second collector in one process) runs
    without it, on connections of its own, as every round did before."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.share: pycurl.CurlShare | None = None

    @contextmanager
    def held(self) -> Iterator[pycurl.CurlShare | None]:
        if not self.lock.acquire(blocking=False):
            yield None
            return
        try:
            if self.share is None:
                share = pycurl.CurlShare()
                # Not LOCK_DATA_DNS: a shared DNS cache would keep a moved target's old
                # address for libcurl's 60 s; without it a new connection resolves afresh.
                for data in (pycurl.LOCK_DATA_CONNECT, pycurl.LOCK_DATA_SSL_SESSION):
                    share.setopt(pycurl.SH_SHARE, data)
                self.share = share
            yield self.share
        finally:
            self.lock.release()


_CONNECTIONS = _Connections()


def fetch_all(targets: list[Target], clock: Clock = system_clock) -> list[Fetched]:
    """Fetch all targets at once; failures come back as Fetched with an error, never raise."""
    with _CONNECTIONS.held() as share:
        return _fetch_all(targets, clock, share)


def _fetch_all(
    targets: list[Target], clock: Clock, share: pycurl.CurlShare | None
) -> list[Fetched]:
    transfers = [_Transfer(target, clock()) for target in targets]
    multi = pycurl.CurlMulti()
    try:
        for transfer in transfers:
            try:
                transfer.curl = _handle(transfer)
                if share is not None:
                    transfer.curl.setopt(pycurl.SHARE, share)
                multi.add_handle(transfer.curl)
            except (pycurl.error, ValueError, TypeError) as error:
                transfer.error = f"cannot request it: {_reason(str(error), transfer.target)}"
        _run(multi, {id(t.curl): t for t in transfers if t.curl is not None})
        return [transfer.result() for transfer in transfers]
    finally:
        for transfer in transfers:
            if transfer.curl is not None:
                multi.remove_handle(transfer.curl)
                transfer.curl.close()
        multi.close()


def _handle(transfer: _Transfer) -> pycurl.Curl:
    target = transfer.target
    headers = revealed(target.headers)
    for name, value in headers.items():
        if any(bad in name + value for bad in "\r\n\0"):
            raise ValueError(f"header {name!r} holds a line break")
    curl = pycurl.Curl()
    curl.setopt(pycurl.URL, target.url.reveal())
    curl.setopt(pycurl.HTTPHEADER, [f"{name}: {value}" for name, value in headers.items()])
    curl.setopt(pycurl.TIMEOUT_MS, max(1, round(target.timeout * 1000)))
    curl.setopt(pycurl.FOLLOWLOCATION, True)
    curl.setopt(pycurl.MAXREDIRS, 10)
    curl.setopt(pycurl.PROTOCOLS, _HTTP)
    curl.setopt(pycurl.REDIR_PROTOCOLS, _HTTP)
    curl.setopt(pycurl.NOPROXY, "*")
    curl.setopt(pycurl.NOSIGNAL, True)
    curl.setopt(pycurl.CAINFO, _CA_BUNDLE)
    curl.setopt(pycurl.WRITEFUNCTION, transfer.write)
    return curl


def _run(multi: pycurl.CurlMulti, transfers: dict[int, _Transfer]) -> None:
    """Drive every transfer to its end with curl's socket interface on an epoll selector
    (select() would stop at 1,024 file descriptors)."""
    selector = selectors.DefaultSelector()
    deadline: list[float | None] = [None]  # when curl wants its timer called

    def on_socket(event: int, fd: int, _multi: object, _data: object) -> None:
        if event == pycurl.POLL_REMOVE:
            if fd in selector.get_map():
                selector.unregister(fd)
            return
        mask = (selectors.EVENT_READ if event & pycurl.POLL_IN else 0) | (
            selectors.EVENT_WRITE if event & pycurl.POLL_OUT else 0
        )
        if fd in selector.get_map():
            selector.modify(fd, mask)
        else:
            selector.register(fd, mask)

    def on_timer(milliseconds: int) -> None:
        deadline[0] = None if milliseconds < 0 else time.monotonic() + milliseconds / 1000

    multi.setopt(pycurl.M_SOCKETFUNCTION, on_socket)
    multi.setopt(pycurl.M_TIMERFUNCTION, on_timer)
    try:
        _, running = multi.socket_action(pycurl.SOCKET_TIMEOUT, 0)
        while running:
            due = deadline[0]
            wait = 1.0 if due is None else max(0.0, due - time.monotonic())
            events = selector.select(min(wait, 1.0)) if selector.get_map() else []
            if not events and not selector.get_map():
                time.sleep(min(wait, 0.01))
            for key, mask in events:
                action = (pycurl.CSELECT_IN if mask & selectors.EVENT_READ else 0) | (
                    pycurl.CSELECT_OUT if mask & selectors.EVENT_WRITE else 0
                )
                _, running = multi.socket_action(key.fd, action)
            due = deadline[0]
            if due is not None and time.monotonic() >= due:
                deadline[0] = None
                _, running = multi.socket_action(pycurl.SOCKET_TIMEOUT, 0)
            _collect(multi, transfers)
        _collect(multi, transfers)
    finally:
        selector.close()


def _collect(multi: pycurl.CurlMulti, transfers: dict[int, _Transfer]) -> None:
    """Record curl's error for each transfer (by its handle's id) that ended with one."""
    while True:
        queued, _, failed = multi.info_read()
        for curl, number, message in failed:
            transfers[id(curl)].curl_error = (number, message)
        if not queued:
            return


def _encoding(content_type: str | None) -> str:
    """The body's declared charset if Python knows it, else UTF-8 (the exposition format's)."""
    for part in (content_type or "").split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key.lower() == "charset" and value:
            try:
                return codecs.lookup(value.strip('"')).name
            except LookupError:
                break
    return "utf-8"


def _reason(message: str, target: Target) -> str:
    """A message's first line, its secrets masked before it is cut (a cut could leave part
    of one): curl may write the request's host or URL into its messages."""
    text = scrub(message or "unknown error", target.url, *target.headers.values())
    return text.splitlines()[0][:200]
