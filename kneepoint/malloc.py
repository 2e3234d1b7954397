"""Cap glibc's malloc arenas and give freed pages back, in-process, so every way of starting
the collector gets it.

glibc gives each thread that allocates while the others hold their arena a new arena (up to
8 per core) and keeps their pages: at 1,000 replicas the collector's resident memory grew in
64 MiB steps about once a minute with the same nine threads, and two arenas kept it flat
(docs/explanation/scale.md). The image sets MALLOC_ARENA_MAX=2 (compose and the Helm
chart run it, unless pointed at another image); `kneepoint collect` or `serve` from a pip
install or a checkout and `./scripts/run` (the demo) had nothing: the collector's scheduler
calls `cap_arenas()` when it is made, before its worker threads start (arenas made before
the call stay, none is added beyond the cap after it).

On a C library without glibc's mallopt (musl, macOS) it does nothing and says so in one
log line. An explicit MALLOC_ARENA_MAX in the environment wins: glibc has read it already,
and it is left as it is.

Capped arenas still keep what they once held: glibc gives memory back only from the top of
a heap, so the pages a job's temporaries freed below a block still in use stay resident. At
100 targets (bench/bench_memory.py) the collector's RSS rose while the bytes malloc had in
use stayed about flat and its free bytes grew (mallinfo2 in its process). `release()` hands
the free pages back (malloc_trim(0)), and Arrow's pool (pandas keeps its strings there) its
unused memory; the scheduler calls it after a job run, at most once per `RELEASE_EVERY`
seconds (collectors/jobs.py `guarded`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)
M_ARENA_MAX = -8  # glibc's malloc.h
ARENAS = 2
# Seconds between two releases: a trim walks every free chunk (a few ms on a 200 MiB heap), so
# not after each of the 5-second scrapes, yet soon after a rollup's or evaluation's peak.
RELEASE_EVERY = 30.0

# The outcome of the first call, for later calls and for tests: the cap in force (None:
# not capped, this C library has no mallopt or refused it).
_capped: int | None = None
_tried = False


def cap_arenas(arenas: int = ARENAS) -> int | None:
    """Limit glibc to `arenas` malloc arenas (MALLOC_ARENA_MAX's value if that is set);
    return the cap in force, or None where it cannot be set. Idempotent: only the first call
    acts."""
    global _capped, _tried
    if _tried:
        return _capped
    _tried = True
    explicit = os.environ.get("MALLOC_ARENA_MAX", "").strip()
    if explicit.isdigit() and int(explicit) > 0:
        _capped = int(explicit)  # glibc read it at start: nothing to do
        log.debug("malloc arenas: MALLOC_ARENA_MAX=%s from the environment", explicit)
        return _capped
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        log.info("malloc arenas: not capped (no glibc mallopt in this C library)")
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if mallopt(M_ARENA_MAX, arenas) != 1:  # mallopt returns 1 on success
        log.info("malloc arenas: not capped (mallopt refused M_ARENA_MAX)")
        return None
    _capped = arenas
    log.debug("malloc arenas: capped at %d", arenas)
    return _capped


def capped() -> int | None:
    """The cap the first `cap_arenas()` call put in force (None: not called, or not set)."""
    return _capped


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def release() -> bool:
    """Give the memory the allocators hold free back to the system: glibc's free pages in
    every arena (malloc_trim(0)), and Arrow's pool's unused memory when pyarrow is loaded
    (never imported here). Return whether glibc's trim ran (False without glibc)."""
    arrow = sys.modules.get("pyarrow")
    if arrow is not None:
        arrow.default_memory_pool().release_unused()
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is None:
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return True


class Releaser:
    """`release()` at most once per `every` seconds of `clock`: call it after each job run.
    Thread-safe: two jobs finishing at once release once."""

    def __init__(
        self,
        every: float = RELEASE_EVERY,
        clock: Callable[[], float] = time.monotonic,
        act: Callable[[], object] = release,
    ) -> None:
        self.every, self.clock, self.act = every, clock, act
        self._last = -float("inf")
        self._lock = threading.Lock()

    def __call__(self) -> bool:
        """Release now if the last release is `every` seconds old; return whether it did."""
        with self._lock:
            now = self.clock()
            if now - self._last < self.every:
                return False
            self._last = now
        self.act()
        return True


# The collector's: every job run of its scheduler passes here (collectors/jobs.py).
after_job = Releaser()
