"""bench/collector_process.py, what bench_prometheus and bench_memory measure the collector
with: the CPU of a whole process tree from /proc, and each job's CPU from a real
`kneepoint collect`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from collector_process import (  # noqa: E402
    job_cpu,
    rss_mib,
    start_collector,
    stop_collector,
    tree_cpu,
    write_config,
)

from tests.conftest import migrated  # noqa: E402

BURN = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\n"


def test_tree_cpu_counts_the_children_a_process_started() -> None:
    """A parent that only waits, its child burning 0.4 s of CPU: the parent's own stat says
    almost nothing, the tree says the child's seconds (live, then collected when it ends)."""
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys\nsubprocess.run([sys.executable, "
         f"'-c', {BURN!r}])\nimport time\ntime.sleep(30)"],
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while tree_cpu(parent.pid) < 0.4 and time.monotonic() < deadline:
            time.sleep(0.1)
        own = Path(f"/proc/{parent.pid}/stat").read_text().rsplit(")", 1)[1].split()
        assert tree_cpu(parent.pid) >= 0.4
        # …and not the parent's own time
        assert (int(own[11]) + int(own[12])) / os.sysconf("SC_CLK_TCK") < 0.4
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.timeout(120)
def test_the_collector_reports_each_jobs_cpu(tmp_path: Path) -> None:
    config = write_config(tmp_path, [], interval=1, evaluation=1)
    migrated(config)
    jobs = tmp_path / "jobs.json"
    collector = start_collector(ROOT, config, jobs)
    try:
        deadline = time.monotonic() + 90  # the first evaluation imports pandas: slow
        seen: dict = {"runs": {}}
        while time.monotonic() < deadline and (
            seen["runs"].get("scrape", 0) < 2 or seen["runs"].get("alerts", 0) < 1
        ):
            time.sleep(0.5)
            seen = job_cpu(collector, jobs)
        assert seen["runs"].get("scrape", 0) >= 2, seen
        assert seen["runs"].get("alerts", 0) >= 1, seen
        assert seen["cpu"]["alerts"] > 0
        assert rss_mib(collector.pid)[0] > 0
    finally:
        final = stop_collector(collector, jobs)
    assert collector.returncode == 0  # SIGTERM: a clean stop, its totals written at exit
    assert final["runs"]["scrape"] >= seen["runs"]["scrape"]
