"""A collector job's temporaries go back to the system after it runs (kneepoint/malloc.py
`release`, called by collectors/jobs.py `guarded`), instead of staying resident as free
pages glibc keeps below the blocks still in use.

The heap checks run in a fresh interpreter: what glibc holds is process state."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kneepoint.malloc import Releaser

ROOT = Path(__file__).resolve().parents[2]
glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")

# A job that leaves the heap as a round's temporaries do: many blocks of a few KiB (below
# glibc's mmap threshold, so from the heap), one in seven still in use when it returns.
# Prints VmRSS (KiB) before the job, at its peak, and after it returned.
FRAGMENTING_JOB = """
from collectors.jobs import Job, guarded

def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS"))

kept, peak = [], []
def job():
    blocks = [bytearray(600 + (i * 7919) % 60000) for i in range(6000)]
    kept.extend(blocks[::7])
    peak.append(rss())

before = rss()
guarded(Job("fragment", job, 5.0))()
print(before, peak[0], rss())
"""


def run(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        check=False,
    )


@glibc_only
def test_a_job_s_freed_temporaries_leave_the_resident_set() -> None:
    done = run(FRAGMENTING_JOB)
    assert done.returncode == 0, done.stderr
    before, peak, after = (int(n) for n in done.stdout.split())
    assert peak - before > 100_000, done.stdout  # the job held over 100 MiB at its peak
    # What stays is about the seventh still in use, not the whole peak.
    assert after - before < 0.4 * (peak - before), done.stdout


def test_releases_at_most_once_per_interval() -> None:
    now = [0.0]
    acted: list[float] = []
    releaser = Releaser(every=30.0, clock=lambda: now[0], act=lambda: acted.append(now[0]))
    done = []
    for at in (0.0, 10.0, 29.9, 30.0, 45.0, 61.0):
        now[0] = at
        done.append(releaser())
    assert acted == [0.0, 30.0, 61.0]
    assert done == [True, False, False, True, False, True]
