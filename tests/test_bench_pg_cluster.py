"""The page bench's kept PostgreSQL cluster (bench/pg_cluster.py): a database asked for by a
newer schema's name is a copy of the newest older store that exists, not an empty one (a
1,000-replica store takes most of an hour to seed), and a database that exists is left as
it is."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import require_real
from tests.postgres import _binaries

pytestmark = [pytest.mark.real, pytest.mark.timeout(120)]
BENCH = Path(__file__).resolve().parents[1] / "bench"


def plain(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def rows(url: str) -> list[int]:
    """Table `seeded`'s numbers in database `url` ([] when it has no such table)."""
    import psycopg

    with psycopg.connect(plain(url)) as connection:
        found = connection.execute("SELECT to_regclass('seeded')").fetchone()
        if found is None or found[0] is None:
            return []
        return [int(n) for (n,) in connection.execute("SELECT n FROM seeded ORDER BY n")]


def write(url: str, *statements: str) -> None:
    import psycopg

    with psycopg.connect(plain(url), autocommit=True) as connection:
        for statement in statements:
            connection.execute(statement)


def test_a_missing_database_is_a_copy_of_the_first_older_one_that_exists() -> None:
    if _binaries() is None:
        require_real("no PostgreSQL server (apt-get install postgresql; scripts/setup does it)")
    sys.path.insert(0, str(BENCH))
    from pg_cluster import kept_postgres

    # Not under pytest's tmp_path: as root, the cluster belongs to `postgres`, which cannot
    # enter root's private pytest folders (tests/postgres.py uses /tmp the same way).
    folder = Path(tempfile.mkdtemp(prefix="kneepoint-pgkeep-"))
    try:
        folder.chmod(0o755)
        with kept_postgres(folder / "pg") as database:
            older, existed = database("store_0002")
            assert not existed
            write(older, "CREATE TABLE seeded (n int)", "INSERT INTO seeded VALUES (1), (2)")
            # The first of the older names that exists is copied (store_0001 does not).
            url, existed = database("store_0003", ["store_0001", "store_0002"])
            assert not existed and rows(url) == [1, 2]
            # An existing database is not replaced by a copy.
            write(older, "INSERT INTO seeded VALUES (3)")
            url, existed = database("store_0003", ["store_0002"])
            assert existed and rows(url) == [1, 2]
            # Nothing older: an empty database.
            url, existed = database("other", ["missing"])
            assert not existed and rows(url) == []
    finally:
        shutil.rmtree(folder, ignore_errors=True)
