"""The app's caches warmed for each new data version before a page asks.

Every version-keyed cache (app/data.py, app/changes.py, app/insight.py) is declared with
`versioned`: st.cache_data, plus a record of the calls pages make (the function and its
arguments, the time arguments kept as offsets from the version's tick). One warmer thread
per config file (started by `data.store()` in a served app) polls the store's data version;
when it moves (a new round, a rollup, a mutation, or the tick on a dead collector) it makes
the recorded calls again with their time arguments moved to the new tick and the new
version, through the same caches, so the next page run reads instead of computing.

Bounded: the calls asked for within the last ROUNDS versions, newest first, at most LIMIT;
the default page's calls and the default range's within the last PINNED_ROUNDS (an hour of
15 s rounds), so the first visitor after a quiet spell finds them warm too.
st.cache_data computes a key once (a page asking while the warmer computes it waits for that
result), and never caches an error: a failed warm call is logged and the page computes as
before.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import streamlit as st
from streamlit.runtime import Runtime

from app.filters import DEFAULT_RANGE
from app.registry import PAGES
from kneepoint.prepared import Version

log = logging.getLogger(__name__)

R = TypeVar("R")
Part = Literal["samples", "changes", "key"]  # which part of the version a cache keys on
ROUNDS = 4  # a call not asked for again within this many new versions is dropped
PINNED_ROUNDS = 240  # the same for the default page's and the default range's calls
LIMIT = 48  # distinct calls remembered (and replayed per version) per config file
POLL = 1.0  # seconds between the warmer's version reads
THREAD = "kneepoint-warmer"

_local = threading.local()


def warming() -> bool:
    """True inside the warmer's own calls (they are not pages asking)."""
    return bool(getattr(_local, "warming", False))


def _nested() -> bool:
    """True inside a versioned computation: its own versioned calls are made again with it
    (the warmer replays the outer call), never recorded as a page's."""
    return bool(getattr(_local, "depth", 0))


def floor(at: float, step: float) -> float:
    return math.floor(at / step) * step if step else at


@dataclass(frozen=True)
class Spec:
    """A cached function: where its version and time arguments are, and the step its times
    are floored to (0: none)."""

    name: str
    call: Callable[..., Any]  # the st.cache_data function
    part: Part | None
    version_at: int | None
    times: tuple[int, ...]
    step: float
    pin: bool = True  # False: its arguments name a moment or a replica, not a view: never pinned

    def asked(self, args: tuple[Any, ...], tick: float) -> tuple[Any, ...]:
        """`args` with the version left out and each time as its offset from the tick."""
        out = list(args)
        if self.version_at is not None:
            out[self.version_at] = None
        for i in self.times:
            out[i] = args[i] - floor(tick, self.step)
        return tuple(out)

    def replayed(self, asked: tuple[Any, ...], version: Version) -> tuple[Any, ...]:
        """The arguments a page computing as of `version` would pass."""
        out = list(asked)
        if self.version_at is not None and self.part is not None:
            out[self.version_at] = getattr(version, self.part)
        for i in self.times:
            out[i] = floor(version.tick, self.step) + asked[i]
        return tuple(out)


@dataclass
class Asked:
    spec: Spec
    args: tuple[Any, ...]  # as Spec.asked keeps them
    round: int  # the version count of the path when a page last asked
    order: int  # newest ask last
    pinned: bool  # asked by the default page or at the default range: kept longer


class Registry:
    """The calls pages asked for, per config file, and the count of versions each saw."""

    def __init__(
        self, limit: int = LIMIT, rounds: int = ROUNDS, pinned_rounds: int = PINNED_ROUNDS
    ) -> None:
        self.limit, self.rounds, self.pinned_rounds = limit, rounds, pinned_rounds
        self._lock = threading.Lock()
        self._asked: dict[str, dict[tuple[Any, ...], Asked]] = {}
        self._round: dict[str, int] = {}
        self._order = itertools.count()

    def record(self, spec: Spec, path: str, args: tuple[Any, ...], tick: float, kept: bool) -> None:
        asked = spec.asked(args, tick)
        with self._lock:
            calls = self._asked.setdefault(path, {})
            key = (spec.name, asked)
            before = calls.get(key)
            calls[key] = Asked(
                spec,
                asked,
                self._round.get(path, 0),
                next(self._order),
                spec.pin and (kept or (before is not None and before.pinned)),
            )
            if len(calls) > self.limit:  # the oldest ask goes, the default's last
                del calls[min(calls, key=lambda k: (calls[k].pinned, calls[k].order))]

    def advance(self, path: str, version: Version) -> list[tuple[Spec, tuple[Any, ...]]]:
        """A new version: count it, drop the calls not asked for within `rounds` versions
        (`pinned_rounds` for pinned ones), and give the others' arguments for it, newest ask
        first."""
        with self._lock:
            now = self._round[path] = self._round.get(path, 0) + 1
            calls = self._asked.get(path, {})
            for key, asked in list(calls.items()):
                if now - asked.round > (self.pinned_rounds if asked.pinned else self.rounds):
                    del calls[key]
            ordered = sorted(calls.values(), key=lambda a: a.order, reverse=True)
        return [(a.spec, a.spec.replayed(a.args, version)) for a in ordered]

    def calls(self, path: str) -> int:
        with self._lock:
            return len(self._asked.get(path, {}))


REGISTRY = Registry()


class Versioned(Generic[R]):
    """A version-keyed st.cache_data function whose calls by pages are recorded."""

    def __init__(self, spec: Spec, signature: inspect.Signature, known: Callable[[str], Version]):
        self.spec, self._signature, self._known = spec, signature, known

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        # Positional, as the warmer calls it: one cache key for the same arguments.
        positional = self._signature.bind(*args, **kwargs).args
        if not warming() and not _nested():
            try:
                path = str(positional[0])
                REGISTRY.record(
                    self.spec, path, positional, self._known(path).tick, _default_view()
                )
            except Exception:  # recording is a help, never a page's failure
                log.exception("warm: could not record a call of %s", self.spec.name)
        # A call inside this one (e.g. the signals every likely cause reads, or the changes
        # before an onset it shares with another) is replayed with it, not on its own: an
        # onset that moves with the tick would be replayed stale.
        _local.depth = getattr(_local, "depth", 0) + 1
        try:
            result: R = self.spec.call(*positional)
        finally:
            _local.depth -= 1
        return result

    def clear(self) -> None:
        self.spec.call.clear()  # type: ignore[attr-defined]


def versioned(
    part: Part | None,
    times: Sequence[str],
    step: float,
    kept: int,
    spinner: bool | str,
    known: Callable[[str], Version],
    pin: bool = True,
) -> Callable[[Callable[..., R]], Versioned[R]]:
    """st.cache_data(max_entries=kept) over a function whose first argument is the config
    file; with `part`, its parameter `version` takes that part of the data version; the
    parameters named in `times` are times relative to the version's tick, floored to
    `step`. `known(path)` is the version pages compute as of. `pin`: the default view's
    calls are kept for PINNED_ROUNDS (not for a function of a moment or a replica)."""

    def wrap(func: Callable[..., R]) -> Versioned[R]:
        signature = inspect.signature(func)
        names = list(signature.parameters)
        spec = Spec(
            f"{func.__module__}.{func.__qualname__}",
            st.cache_data(max_entries=kept, show_spinner=spinner)(func),
            part,
            names.index("version") if part is not None else None,
            tuple(names.index(t) for t in times),
            step,
            pin,
        )
        return Versioned(spec, signature, known)

    return wrap


def _default_view() -> bool:
    """Whether this page run is the default page or at the default range (kept longer)."""
    try:
        params = st.query_params
        return params.get("page") == PAGES[0].url_path or (
            params.get("range", DEFAULT_RANGE) == DEFAULT_RANGE
        )
    except Exception:  # no page run (a script, a test): nothing to keep
        return False


class Warmer:
    """Replays the recorded calls of `path` for each new data version, in one thread."""

    def __init__(
        self,
        path: str,
        read: Callable[[str], Version],
        registry: Registry = REGISTRY,
        poll: float = POLL,
    ) -> None:
        self.path, self._read, self._registry, self._poll = path, read, registry, poll
        self.warmed: Version | None = None  # the newest version whose calls were all made
        self.computed = 0  # calls made, in all
        self.failed = 0  # of which raised (each logged)
        self._seen: Version | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def once(self) -> bool:
        """Read the version; when it moved, replay the calls for it. True if it replayed
        them all (False: the version did not move, or moved again during the replay)."""
        found = self._read(self.path)
        if found == self._seen:
            return False
        self._seen = found
        _local.warming = True
        try:
            for spec, args in self._registry.advance(self.path, found):
                if self._stop.is_set() or self._read(self.path) != found:
                    return False  # a newer version: its calls, not these, are worth making
                self.computed += 1
                try:
                    spec.call(*args)
                except Exception:  # the page computes it again and shows the error
                    self.failed += 1
                    log.exception("warm: %s failed; pages compute it themselves", spec.name)
        finally:
            _local.warming = False
        self.warmed = found
        return True

    def settle(self, tries: int = 3) -> bool:
        """Replay until the version read now is warmed (at most `tries` replays, each cut
        short when the version moves): what the thread does, at once. True if warmed."""
        for _ in range(tries):
            self.once()
            if self.warmed is not None and self.warmed == self._read(self.path):
                return True
        return False

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.once()
            except Exception:  # the store unreachable for now: pages say so themselves
                log.exception("warm: reading the data version failed")
            self._stop.wait(self._poll)

    def start(self) -> Warmer:
        self._thread = threading.Thread(target=self.run, name=THREAD, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


_WARMERS: dict[str, Warmer] = {}
_STARTING = threading.Lock()


def ensure(path: str, read: Callable[[str], Version]) -> Warmer:
    """The warmer of `path`, started on first need (one per process and config file)."""
    with _STARTING:
        found = _WARMERS.get(path)
        if found is None:
            found = _WARMERS[path] = Warmer(path, read).start()
        return found


def served() -> bool:
    """Whether a Streamlit server runs this process (AppTest's stand-in runtime is not one:
    tests and benches start a warmer themselves, when they mean to)."""
    return Runtime.exists() and type(Runtime.instance()) is Runtime


class _NoContextWarning(logging.Filter):
    """The warmer's thread has no script run, by design: Streamlit's warning about it on
    every cached call says nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        return THREAD not in record.getMessage()


logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").addFilter(
    _NoContextWarning()
)
