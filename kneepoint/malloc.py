"""Cap glibc's malloc arenas in-process, so every way of starting the collector gets it.

glibc gives each thread that allocates while the others hold their arena a new arena (up to
8 per core) and keeps their pages: at 1,000 replicas the collector's resident memory grew in
64 MiB steps about once a minute with the same nine threads, and two arenas kept it flat
(README "Scale, 1,000 replicas"). The image sets MALLOC_ARENA_MAX=2 (compose and the Helm
chart run it, unless pointed at another image); `kneepoint collect` or `serve` from a pip
install or a checkout and `./scripts/run` (the demo) had nothing: the collector's scheduler
calls `cap_arenas()` when it is made, before its worker threads start (arenas made before
the call stay, none is added beyond the cap after it).

On a C library without glibc's mallopt (musl, macOS) it does nothing and says so in one
log line. An explicit MALLOC_ARENA_MAX in the environment wins: glibc has read it already,
and it is left as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)
M_ARENA_MAX = -8  # glibc's malloc.h
ARENAS = 2

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
