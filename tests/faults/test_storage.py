"""Storage faults under a real `kneepoint collect` process scraping a loopback target every
half second: the database locked by another connection, the disk full (a tiny tmpfs), the
database file made read-only, the database file deleted. For each: the collector stays up,
logs the error, records the failed rounds once it can, resumes storing by itself when the
fault clears, and every row committed before the fault is still there."""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import VLLM_032, MetricsServer, Route, migrated, require_real

KNEEPOINT = [sys.executable, "-m", "kneepoint.cli"]


@dataclass
class Collecting:
    """A collector process, its database and its log."""

    database: Path
    log: Path
    process: subprocess.Popen[bytes]

    def rows(self) -> set[tuple[int, float]]:
        """The stored replica samples; never creates the file (mode=rw)."""
        with sqlite3.connect(f"file:{self.database}?mode=rw", uri=True, timeout=30) as db:
            return set(db.execute("SELECT target_id, ts FROM replica_samples"))

    def scrape_health(self) -> tuple[int, int]:
        with sqlite3.connect(f"file:{self.database}?mode=rw", uri=True, timeout=30) as db:
            row = db.execute("SELECT runs, failures FROM job_health WHERE job_id = 'scrape'")
            return row.fetchone() or (0, 0)

    def said(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, condition: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
        """Poll `condition` until it holds; fail naming `what`, with the log, if the process
        exits or the deadline passes first."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"collector exited: {self.said()[-3000:]}"
            with suppress(sqlite3.OperationalError):  # the test's own read hit the fault
                if condition():
                    return
            time.sleep(0.1)
        pytest.fail(f"{what} within {seconds:g}s; log: {self.said()[-3000:]}")

    def wait_for_more_rows(self, than: set[tuple[int, float]], count: int = 2) -> None:
        self.wait(lambda: len(self.rows() - than) >= count, f"{count} new rows")

    def wait_for_scrape_error(self, phrase: str) -> None:
        """Until the log says a scrape round failed with `phrase` ("scrape job: storage
        error: …"), not merely that a round's outcome could not be recorded: that line is
        logged for a round that succeeded too, and then no failed round is ever counted."""
        self.wait(
            lambda: any(
                "scrape job: storage error" in line and phrase in line
                for line in self.said().splitlines()
            ),
            f"a failed scrape logged with {phrase!r}",
        )

    def wait_for_failures_recorded(self, than: int) -> None:
        """Until job_health counts more failed scrape rounds than `than`: those of the fault,
        written once the database takes writes again."""
        self.wait(lambda: self.scrape_health()[1] > than, "the failed rounds recorded")


@contextmanager
def collecting(
    folder: Path, server: MetricsServer, log: Path | None = None
) -> Iterator[Collecting]:
    """Migrate a database in `folder` and run `kneepoint collect` on it, with a one-second
    busy timeout so that a lock shows within a round; its output goes to `log` (default:
    collector.log in `folder`)."""
    server.routes = {"/metrics": Route(VLLM_032.read_bytes())}
    database = folder / "k.db"
    config = folder / "kneepoint.yaml"
    config.write_text(
        f"database: 'sqlite:///{database}?timeout=1'\n"
        "scrape_interval: 500ms\nevaluation_interval: 1s\n"
        f"targets:\n  - {{name: a, kind: vllm, url: '{server.url('/metrics')}'}}\n"
    )
    migrated(config)
    log = log or folder / "collector.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [*KNEEPOINT, "collect", "--config", str(config)],
            stdout=out,
            stderr=out,
        )
    running = Collecting(database, log, process)
    try:
        running.wait(lambda: len(running.rows()) >= 3, "3 scrapes stored before the fault")
        yield running
        assert process.poll() is None, f"collector exited: {running.said()[-3000:]}"
    finally:
        process.kill()
        process.wait(10)


def assert_kept_and_sound(running: Collecting, before: set[tuple[int, float]]) -> None:
    assert before <= running.rows()  # every row committed before the fault
    with sqlite3.connect(f"file:{running.database}?mode=rw", uri=True) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_locked_database_fails_rounds_that_are_logged_recorded_and_then_resumed(
    metrics_server: MetricsServer, tmp_path: Path
) -> None:
    with collecting(tmp_path, metrics_server) as running:
        failures = running.scrape_health()[1]
        before = running.rows()
        holder = sqlite3.connect(running.database, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")  # the write lock, held by another connection
        try:
            running.wait_for_scrape_error("database is locked")
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        running.wait_for_more_rows(before)
        assert_kept_and_sound(running, before)
        running.wait_for_failures_recorded(failures)


def test_a_full_disk_fails_rounds_and_storing_resumes_when_space_is_freed(
    metrics_server: MetricsServer, tmp_path: Path
) -> None:
    if os.geteuid() != 0:
        require_real("mounting a tmpfs needs root")
    with tempfile.TemporaryDirectory() as folder:
        mount = Path(folder)
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=3m,mode=0755", "tmpfs", str(mount)],
            capture_output=True,
            text=True,
        )
        if mounted.returncode != 0:
            require_real(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
        try:
            # The log on another filesystem, where there is room to say the disk is full.
            with collecting(mount, metrics_server, tmp_path / "collector.log") as running:
                failures = running.scrape_health()[1]
                filler = mount / "filler"
                fill(filler)
                running.wait_for_scrape_error("database or disk is full")
                during = running.rows()
                filler.unlink()
                running.wait_for_more_rows(during)
                assert_kept_and_sound(running, during)
                running.wait_for_failures_recorded(failures)
        finally:
            subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(path: Path) -> None:
    """Write zeros to `path` until the filesystem takes not one more byte."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        size = 1 << 16
        while size:
            try:
                os.write(descriptor, b"\0" * size)
            except OSError as error:
                assert error.errno == errno.ENOSPC
                size //= 2
    finally:
        os.close(descriptor)


def test_a_read_only_database_file_fails_rounds_until_it_is_writable_again(
    metrics_server: MetricsServer, tmp_path: Path
) -> None:
    with collecting(tmp_path, metrics_server) as running:
        failures = running.scrape_health()[1]
        before = running.rows()
        # Read-only even for root (which file modes do not stop): the immutable attribute.
        made = subprocess.run(["chattr", "+i", str(running.database)], capture_output=True)
        if made.returncode != 0:
            require_real(f"cannot make a file immutable: {made.stderr.decode().strip()}")
        try:
            running.wait_for_scrape_error("attempt to write a readonly database")
            during = running.rows()
        finally:
            subprocess.run(["chattr", "-i", str(running.database)], check=True)
        running.wait_for_more_rows(during)
        assert_kept_and_sound(running, before)
        running.wait_for_failures_recorded(failures)


def test_a_deleted_database_file_is_not_recreated_empty_and_storing_resumes_when_restored(
    metrics_server: MetricsServer, tmp_path: Path
) -> None:
    with collecting(tmp_path, metrics_server) as running:
        failures = running.scrape_health()[1]
        before = running.rows()
        kept = tmp_path / "backup.db"
        os.link(running.database, kept)  # the operator's copy (the same file)
        running.database.unlink()
        running.wait_for_scrape_error(f"database file {running.database} does not exist")
        assert not running.database.exists()  # no empty database left in its place
        os.link(kept, running.database)  # restored
        running.wait_for_more_rows(before)
        assert_kept_and_sound(running, before)
        running.wait_for_failures_recorded(failures)
