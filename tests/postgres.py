"""A real PostgreSQL (Debian's package) for the store tests: a throwaway cluster on a free
port, started once per test session, with a fresh database for every store.

Under pytest (tests/conftest.py sets SHARE), every `running_postgres()` block of the session
gets the same cluster, started by the first and stopped when the session ends: each start
(initdb, start, stop) costs seconds, and the tests never share a database, only the server.
Elsewhere (the benches) each block has a cluster of its own, removed when it ends.

Connections are trusted (no password), except for roles in the group `password_login`:
`fresh(password=…)` makes such a role, which must give its password (SCRAM) to connect."""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from urllib.parse import quote

from tests.conftest import free_port, require_real


def _binaries() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


SHARE = False  # one cluster for every block, until stop_shared(): set by tests/conftest.py
_shared = ExitStack()  # the shared cluster, while it runs
_shared_fresh: list[Callable[..., str]] = []  # its `fresh`, once started


@contextmanager
def running_postgres() -> Iterator[Callable[..., str]]:
    """Yield a function that creates an empty database and returns its SQLAlchemy URL: on
    the session's shared cluster (SHARE), else on a cluster of this block's own."""
    if not SHARE:
        with _throwaway_cluster() as fresh:
            yield fresh
        return
    if not _shared_fresh:
        _shared_fresh.append(_shared.enter_context(_throwaway_cluster()))
    yield _shared_fresh[0]


def stop_shared() -> None:
    """Stop and remove the shared cluster, if one was started."""
    _shared_fresh.clear()
    _shared.close()


@contextmanager
def _throwaway_cluster() -> Iterator[Callable[..., str]]:
    import psycopg

    bin_dir = _binaries()
    if bin_dir is None:
        require_real("no PostgreSQL server (apt-get install postgresql; scripts/setup does it)")
    assert bin_dir is not None
    # PostgreSQL refuses to run as root: as root, the cluster belongs to `postgres`.
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    folder = tempfile.mkdtemp(prefix="kneepoint-pg-")
    if as_user:
        shutil.chown(folder, "postgres")
    data, port = os.path.join(folder, "data"), free_port()

    def run(*command: str) -> None:
        done = subprocess.run([*as_user, *command], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{command[0]} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")

    run(f"{bin_dir}/initdb", "-D", data, "-U", "kneepoint", "--auth=trust", "-E", "UTF8")
    # First match wins: members of password_login must give their password; others trusted.
    hba = os.path.join(data, "pg_hba.conf")
    with open(hba, encoding="utf-8") as file:
        trusted = file.read()
    with open(hba, "w", encoding="utf-8") as file:
        file.write("host all +password_login 127.0.0.1/32 scram-sha-256\n" + trusted)
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
    run(f"{bin_dir}/pg_ctl", "-D", data, "-o", options, "-l", f"{folder}/log", "-w", "start")
    numbers = itertools.count()

    def fresh(password: str | None = None) -> str:
        """A new empty database. With `password`: owned by a new role that must log in
        with it, and the URL carries it (user:password@)."""
        name = f"store_{next(numbers)}"
        with psycopg.connect(
            f"host=127.0.0.1 port={port} user=kneepoint dbname=postgres", autocommit=True
        ) as connection:
            if password is None:
                connection.execute(f"CREATE DATABASE {name}")
                return f"postgresql+psycopg://kneepoint@127.0.0.1:{port}/{name}"
            from psycopg import sql

            connection.execute(
                "DO $$ BEGIN CREATE ROLE password_login NOLOGIN;"
                " EXCEPTION WHEN duplicate_object THEN NULL; END $$"
            )
            role = f"{name}_owner"
            connection.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE password_login").format(
                    sql.Identifier(role), sql.Literal(password)
                )
            )
            connection.execute(f"CREATE DATABASE {name} OWNER {role}")
        return f"postgresql+psycopg://{role}:{quote(password, safe='')}@127.0.0.1:{port}/{name}"

    try:
        yield fresh
    finally:
        run(f"{bin_dir}/pg_ctl", "-D", data, "-m", "immediate", "stop")
        shutil.rmtree(folder, ignore_errors=True)
