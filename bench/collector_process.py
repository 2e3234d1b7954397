"""The collector as its own process, for the benches that measure it from outside: the
config for a twin fleet, `kneepoint collect` started from a source tree (this checkout or
an older one, `--source`), and what /proc says about its process tree (CPU, memory).

The collector is `kneepoint collect` run by its own entry (kneepoint.cli's app) under a
small bootstrap that also times each scheduler job's CPU on its own thread's clock
(collectors.jobs.guarded, wrapped) and writes the totals to a JSON file when the
collector stops (SIGTERM): two thread-clock reads per job run, nothing else changed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CLOCK = os.sysconf("SC_CLK_TCK")

# The demo's two SLOs (kneepoint/demo.py): burn-rate rules in the export and in evaluation.
SLOS = [
    {"name": "interactive-ttft", "metric": "ttft", "threshold": "1s", "objective": 0.99,
     "window": "30d"},
    {"name": "interactive-itl", "metric": "itl", "threshold": "100ms", "objective": 0.99,
     "window": "30d"},
]  # fmt: skip

BOOTSTRAP = """
import atexit, cProfile, json, os, signal, sys, threading, time
import collectors.jobs as jobs
spent, runs, lock, profiles = {}, {}, threading.Lock(), []
profiling = bool(os.environ.get("KNEEPOINT_BENCH_PROFILE"))
original = jobs.guarded
def guarded(job):
    run = original(job)
    def timed():
        profile = cProfile.Profile(time.thread_time) if profiling else None
        began = time.thread_time()
        if profile is not None:
            profile.enable()
        try:
            return run()
        finally:
            if profile is not None:
                profile.disable()
            with lock:
                spent[job.id] = spent.get(job.id, 0.0) + time.thread_time() - began
                runs[job.id] = runs.get(job.id, 0) + 1
                if profile is not None:
                    profiles.append(profile)
    return timed
jobs.guarded = guarded
import gc
collecting = threading.local()
gc_spent = [0.0, 0.0, 0.0]
gc_runs = [0, 0, 0]
def on_gc(phase, info):
    if phase == "start":
        collecting.began = time.thread_time()
    elif getattr(collecting, "began", None) is not None:
        gc_spent[info["generation"]] += time.thread_time() - collecting.began
        gc_runs[info["generation"]] += 1
        collecting.began = None
gc.callbacks.append(on_gc)
def dump(*_):
    with lock:
        text = json.dumps({"cpu": spent, "runs": runs, "gc": gc_spent, "gc_runs": gc_runs,
                           "at": time.time()})
    with open(sys.argv[1] + ".tmp", "w") as file:
        file.write(text)
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
def finish():
    dump()
    if profiling and profiles:
        import pstats
        with lock:
            stats = pstats.Stats(profiles[0])
            for profile in profiles[1:]:
                stats.add(profile)
        stats.dump_stats(os.environ["KNEEPOINT_BENCH_PROFILE"])
signal.signal(signal.SIGUSR1, dump)
dump()  # the file's existence says SIGUSR1 is handled (its default action kills)
atexit.register(finish)
from kneepoint.cli import app
app(["collect", "--config", sys.argv[2]])
"""


def write_config(
    folder: Path,
    targets: list[tuple[str, str, str, list[str]]],
    interval: float,
    evaluation: float = 15.0,
) -> Path:
    """A kneepoint.yaml for the twin's targets (name, kind, url, gpus), SQLite in `folder`,
    the built-in rules and the demo's two SLOs."""
    config: dict[str, Any] = {
        "database": f"sqlite:///{folder / 'k.db'}",
        "scrape_interval": f"{interval:g}s",
        "evaluation_interval": f"{evaluation:g}s",
        "targets": [
            {"name": name, "kind": kind, "url": url, **({"gpus": gpus} if gpus else {})}
            for name, kind, url, gpus in targets
        ],
        "slos": SLOS,
    }
    path = folder / "kneepoint.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def kneepoint(source: Path, *args: str) -> str:
    """A kneepoint command of the `source` tree, its stdout (exit status checked)."""
    done = subprocess.run(
        [sys.executable, "-m", "kneepoint.cli", *args],
        capture_output=True,
        text=True,
        cwd=source,
        env=environment(source),
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"kneepoint {' '.join(args)} failed: {done.stderr[-2000:]}")
    return done.stdout


def environment(source: Path, arena_max: str | None = None) -> dict[str, str]:
    """The environment of a launch path without the image's MALLOC_ARENA_MAX (unless given):
    `kneepoint collect`, ./scripts/run, compose and Helm do not set it."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    if arena_max is not None:
        env["MALLOC_ARENA_MAX"] = arena_max
    return {**env, "PYTHONPATH": str(source)}


def start_collector(
    source: Path,
    config: Path,
    jobs_file: Path,
    arena_max: str | None = None,
    profile: Path | None = None,
) -> subprocess.Popen[bytes]:
    """`kneepoint collect --config CONFIG` of the `source` tree, its jobs' CPU to
    `jobs_file` on SIGUSR1 and when it stops; with `profile`, a cProfile of every job run
    (on its thread's CPU clock) written there when it stops."""
    env = environment(source, arena_max)
    if profile is not None:
        env["KNEEPOINT_BENCH_PROFILE"] = str(profile)
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(BOOTSTRAP), str(jobs_file), str(config)],
        cwd=source,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def job_cpu(process: subprocess.Popen[bytes], jobs_file: Path) -> dict[str, Any]:
    """The jobs' CPU seconds and runs so far (SIGUSR1: the collector writes them)."""
    deadline = time.monotonic() + 60
    while not jobs_file.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)  # not yet started: SIGUSR1 would kill it
    before = jobs_file.stat().st_mtime_ns if jobs_file.exists() else 0
    process.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if jobs_file.exists() and jobs_file.stat().st_mtime_ns != before:
            return dict(json.loads(jobs_file.read_text()))
        time.sleep(0.05)
    return {"cpu": {}, "runs": {}}


def stop_collector(process: subprocess.Popen[bytes], jobs_file: Path) -> dict[str, Any]:
    """SIGTERM (a clean stop); the jobs' CPU seconds and runs it wrote."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    try:
        return dict(json.loads(jobs_file.read_text()))
    except (OSError, ValueError):
        return {"cpu": {}, "runs": {}}


def _stat(pid: int | str, task: str = "") -> list[str]:
    path = f"/proc/{pid}/task/{task}/stat" if task else f"/proc/{pid}/stat"
    return Path(path).read_text().rsplit(")", 1)[1].split()


def tree(pid: int) -> list[int]:
    """`pid` and every process below it, now."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int(_stat(entry.name)[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def tree_cpu(pid: int) -> float:
    """CPU seconds (utime + stime) of `pid` and every process below it: the live ones' own,
    plus what each has collected from its children that ended (cutime + cstime)."""
    total = 0.0
    for member in tree(pid):
        try:
            fields = _stat(member)
        except OSError:
            continue  # ended between the listing and the read
        total += sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLOCK
    return total


def threads_cpu(pid: int) -> dict[str, float]:
    """CPU seconds by thread name (comm) of one process; threads of one name summed."""
    spent: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = _stat(pid, task.name)
        except OSError:
            continue
        spent[name] = spent.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / CLOCK
    return spent


def rss_mib(pid: int) -> tuple[float, float]:
    """VmRSS and VmHWM of a process, MiB."""
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return (int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024)


def wait_for_rows(database: Path, rows: int, timeout: float = 120.0) -> None:
    """Until the collector has stored `rows` replica samples (it is scraping)."""
    import sqlite3

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with sqlite3.connect(database, timeout=5) as connection:
                count = connection.execute("SELECT count(*) FROM replica_samples").fetchone()[0]
            if count >= rows:
                return
        except sqlite3.Error:
            pass
        time.sleep(0.5)
    sys.exit(f"the collector stored fewer than {rows} replica samples in {timeout:g}s")
