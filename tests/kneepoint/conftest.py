"""The store tests run on SQLite and on a real PostgreSQL: `fresh_url()` gives an empty
database of the kind under test."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest

from tests.postgres import running_postgres


@pytest.fixture(
    scope="session", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.real)]
)
def fresh_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[], str]]:
    if request.param == "sqlite":
        folder, numbers = tmp_path_factory.mktemp("stores"), itertools.count()
        yield lambda: f"sqlite:///{folder / f'store-{next(numbers)}.db'}"
    else:
        with running_postgres() as fresh:
            yield fresh
