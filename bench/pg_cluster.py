"""PostgreSQL for the page bench: the throwaway cluster of tests/postgres.py, or (--keep DIR) a
cluster kept in DIR between runs, so that a store seeded once (1,000 replicas × 7 days: about
6 minutes and 12 GB) serves many runs.

The kept cluster is started the way tests/postgres.py starts its throwaway one (Debian's
binaries, loopback only, trusted connections, fsync off); tests/postgres.py has no way to keep
its folder, hence the few lines of initdb/pg_ctl here. A second bench on a kept cluster that
is running uses it and leaves it running (so that a review-only run can go beside a page run)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import free_port  # noqa: E402
from tests.postgres import _binaries, running_postgres  # noqa: E402


@contextmanager
def kept_postgres(folder: Path) -> Iterator[Callable[..., tuple[str, bool]]]:
    """A cluster whose data lives in `folder` (made on first use). Yields `database(name)`,
    which returns the SQLAlchemy URL of database `name` and whether it already existed."""
    import psycopg

    bin_dir = _binaries()
    if bin_dir is None:
        raise SystemExit("no PostgreSQL server (apt-get install postgresql; scripts/setup does it)")
    # PostgreSQL refuses to run as root: as root, the cluster belongs to `postgres`.
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if as_user:
        shutil.chown(folder, "postgres")
    data, port = folder / "data", free_port()

    def run(*command: str) -> None:
        done = subprocess.run([*as_user, *command], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{command[0]} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")

    if not (data / "PG_VERSION").exists():
        run(f"{bin_dir}/initdb", "-D", str(data), "-U", "kneepoint", "--auth=trust", "-E", "UTF8")
    running = _running_port(bin_dir, data, as_user)
    if running is not None:  # another bench's: used as it is, and left running for it
        port = running
    else:
        options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = f"{folder}/log"
        run(f"{bin_dir}/pg_ctl", "-D", str(data), "-o", options, "-l", log, "-w", "start")

    def database(name: str, copy_of: Sequence[str] = ()) -> tuple[str, bool]:
        """Database `name`, made when missing: a copy of the first of `copy_of` that exists
        (a store seeded once serves a checkout with a newer schema, which migrates its copy
        forward: seeding 1,000 replicas takes most of an hour), else empty."""
        with psycopg.connect(
            f"host=127.0.0.1 port={port} user=kneepoint dbname=postgres", autocommit=True
        ) as connection:

            def exists(candidate: str) -> bool:
                query = "SELECT 1 FROM pg_database WHERE datname = %s"
                return connection.execute(query, (candidate,)).fetchone() is not None

            found = exists(name)
            source = next((c for c in copy_of if exists(c)), None)
            if not found and source is not None:
                began = time.perf_counter()
                # FILE_COPY: the files copied as they are, not WAL-logged block by block.
                connection.execute(
                    f'CREATE DATABASE "{name}" TEMPLATE "{source}" STRATEGY FILE_COPY'
                )
                print(
                    f"{name}: a copy of {source} ({time.perf_counter() - began:.0f} s)",
                    flush=True,
                )
            elif not found:
                connection.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://kneepoint@127.0.0.1:{port}/{name}", found

    try:
        yield database
    finally:
        if running is None:
            run(f"{bin_dir}/pg_ctl", "-D", str(data), "-m", "fast", "stop")


def _running_port(bin_dir: str, data: Path, as_user: list[str]) -> int | None:
    """The port of the server already running on `data` (pg_ctl status says so; its
    postmaster.pid's fourth line is the port), or None."""
    status = subprocess.run(
        [*as_user, f"{bin_dir}/pg_ctl", "-D", str(data), "status"],
        capture_output=True,
        check=False,
    )
    if status.returncode != 0:
        return None
    return int((data / "postmaster.pid").read_text().splitlines()[3])


@contextmanager
def throwaway_postgres() -> Iterator[Callable[..., tuple[str, bool]]]:
    """tests/postgres.py's throwaway cluster, with the same `database(name, copy_of)` as
    kept_postgres (every database is new and empty: the cluster is removed at the end)."""
    with running_postgres() as fresh:
        yield lambda name, copy_of=(): (fresh(), False)
