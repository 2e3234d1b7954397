"""`kneepoint` with a wall clock the chaos run can step: `python bench/chaos_clock.py OFFSET_FILE
collect --config …` runs the CLI with `time.time()` offset by the seconds written in
OFFSET_FILE (a float; missing or unreadable means no change to the last offset read).

`time.time` is replaced before kneepoint is imported, so `kneepoint.clock.system_clock` (bound
to `time.time` at import) and every `time.time()` call in kneepoint steps with it: sample
times, evaluation times, the outbox's created/next-attempt/lease times, job health. What it
does not step is what reads the C-level clock directly: `datetime.now()` (APScheduler's own
timer) and SQLite. APScheduler's handling of a real clock step is covered by
tests/faults/test_collect.py (the step-safe scheduler).

A thread reads the file every 50 ms and, after each change it applies, writes the offset it
applied to OFFSET_FILE + ".ack", so the chaos run knows when the step took effect.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from pathlib import Path

_real_time = time.time
_offset = [0.0]


def _read(path: Path) -> float | None:
    try:
        return float(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _follow(path: Path, ack: Path) -> None:
    applied: float | None = None
    while True:
        wanted = _read(path)
        if wanted is not None and wanted != applied:
            _offset[0] = wanted
            applied = wanted
            with contextlib.suppress(OSError):  # a full disk: the run sees the ack later
                ack.write_text(repr(wanted))
        time.sleep(0.05)


def stepped_time() -> float:
    return _real_time() + _offset[0]


def main() -> None:
    path = Path(sys.argv[1])
    ack = path.with_name(path.name + ".ack")
    first = _read(path)
    _offset[0] = first if first is not None else 0.0
    time.time = stepped_time  # before kneepoint binds it
    threading.Thread(target=_follow, args=(path, ack), daemon=True).start()
    sys.argv = ["kneepoint", *sys.argv[2:]]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from kneepoint.cli import main as kneepoint_main

    kneepoint_main()


if __name__ == "__main__":
    main()
