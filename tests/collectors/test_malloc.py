"""The collector caps glibc's malloc arenas itself (kneepoint/malloc.py), on every launch
path, not only in the image whose Dockerfile sets MALLOC_ARENA_MAX=2.

Each check runs in a fresh interpreter without MALLOC_ARENA_MAX, since the cap is process
state that glibc keeps and an earlier test (or the environment) would decide it."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import migrated

ROOT = Path(__file__).resolve().parents[2]
glibc_only = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="mallopt(M_ARENA_MAX) is glibc's"
)

# Eight threads allocate at the same time, then glibc's malloc_stats() lists the arenas
# (one "Arena N:" block each, on stderr).
ARENAS_AFTER_THREADS = """
import ctypes, threading
barrier = threading.Barrier(8)
def work():
    barrier.wait()
    kept = [bytearray(200_000) for _ in range(20)]
    barrier.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
ctypes.CDLL("libc.so.6").malloc_stats()
"""


def python(code: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={**env, "PYTHONPATH": str(ROOT)},
        check=False,
    )


def arenas(stderr: str) -> int:
    return len(re.findall(r"^Arena \d+:", stderr, re.MULTILINE))


@glibc_only
def test_cap_arenas_limits_glibc_to_two_arenas() -> None:
    uncapped = python(ARENAS_AFTER_THREADS)
    capped = python(
        "from kneepoint.malloc import cap_arenas\nprint(cap_arenas())\n" + ARENAS_AFTER_THREADS
    )
    assert capped.returncode == 0, capped.stderr
    assert capped.stdout.strip() == "2"
    assert arenas(capped.stderr) == 2, capped.stderr
    # Without the cap the same threads take more: the cap is what keeps it at two.
    assert arenas(uncapped.stderr) > 2, uncapped.stderr


@glibc_only
def test_kneepoint_collect_caps_the_arenas_before_it_schedules(tmp_path: Path) -> None:
    """`kneepoint collect` as its entry runs it, with only the scheduler's start replaced
    (it would block): the cap is in force when the scheduler would start its threads."""
    config = tmp_path / "kneepoint.yaml"
    config.write_text(f"database: sqlite:///{tmp_path / 'k.db'}\ntargets: []\n")
    migrated(config)
    done = python(f"""
        from collectors.scheduler import StepSafeBlockingScheduler
        from kneepoint import malloc
        from kneepoint.cli import app
        seen = []
        def start(self, *args, **kwargs):
            seen.append(malloc.capped())
            raise KeyboardInterrupt  # `collect` treats it as Ctrl-C: a clean stop
        StepSafeBlockingScheduler.start = start
        print("before", malloc.capped())
        try:
            app(["collect", "--config", {str(config)!r}])
        except SystemExit:
            pass
        print("at start", seen)
    """)
    assert done.returncode == 0, done.stderr
    assert "before None" in done.stdout  # importing does not cap: the collector's start does
    assert "at start [2]" in done.stdout, done.stdout + done.stderr


def test_an_explicit_malloc_arena_max_is_left_in_force() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "from kneepoint.malloc import cap_arenas; print(cap_arenas())"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "MALLOC_ARENA_MAX": "4", "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "4"
