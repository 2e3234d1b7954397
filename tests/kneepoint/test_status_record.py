"""The records of kneepoint/records.py are the status `build_status` builds and the rows
`build_view` adds: every block of a status on a seeded store has exactly its record's keys
(no key missing, none undeclared), and each value has the record's type. The JSON contract's
documented keys are checked against the built status in tests/kneepoint/test_status.py;
this checks the declaration."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

import pytest

from kneepoint import records
from kneepoint.config import Config
from kneepoint.derived.cost import Economics
from kneepoint.records import (
    FleetNumbers,
    GoneTarget,
    GpuStatus,
    HitRates,
    KneeCost,
    Numbers,
    PageNumbers,
    ReplicaHitRate,
    ReplicaStatus,
    Status,
    WindowNumbers,
)
from kneepoint.status import build_status, hit_rates
from kneepoint.store.db import open_store
from kneepoint.views import build_view
from tests.kneepoint.test_status import config, status  # noqa: F401  (the seeded store)

# A value of a declared type at runtime: the JSON types the builder writes. An int is a
# float where the record says float (a whole window's seconds, a counter's increase).
RUNTIME = {float: (int, float), int: (int,), str: (str,), bool: (bool,)}


def conforms(value: Any, declared: Any) -> bool:
    """Is `value` of the `declared` type (a record's annotation, resolved)?"""
    if declared is Any:
        return True
    if isinstance(declared, types.UnionType) or typing.get_origin(declared) is typing.Union:
        return any(conforms(value, member) for member in typing.get_args(declared))
    if declared is type(None):
        return value is None
    if typing.is_typeddict(declared):
        return isinstance(value, dict) and keys_and_types(value, declared) == []
    origin = typing.get_origin(declared)
    if origin is list:
        (item,) = typing.get_args(declared)
        return isinstance(value, list) and all(conforms(v, item) for v in value)
    if origin is dict:
        key, item = typing.get_args(declared)
        return isinstance(value, dict) and all(
            conforms(k, key) and conforms(v, item) for k, v in value.items()
        )
    if declared is bool:
        return isinstance(value, bool)
    # bool is an int in Python, never a number of the contract.
    return isinstance(value, RUNTIME[declared]) and not isinstance(value, bool)


def keys_and_types(block: Mapping[str, Any], record: type) -> list[str]:
    """What is wrong with `block` as a `record`: missing or undeclared keys, wrong types."""
    hints = typing.get_type_hints(record, vars(records))
    problems = [f"missing {k}" for k in record.__required_keys__ if k not in block]
    problems += [f"undeclared {k}" for k in block if k not in hints]
    problems += [
        f"{k}: {block[k]!r} is not {hints[k]}"
        for k in hints
        if k in block and not conforms(block[k], hints[k])
    ]
    return problems


def test_every_key_is_required() -> None:
    """A record's keys are all present in every status (a number with no data is None)."""
    for record in (
        Status,
        ReplicaStatus,
        Numbers,
        FleetNumbers,
        GpuStatus,
        GoneTarget,
        HitRates,
        WindowNumbers,
    ):
        assert record.__required_keys__ == frozenset(typing.get_type_hints(record))
        assert record.__optional_keys__ == frozenset()


def test_the_status_has_exactly_its_records_keys_and_types(status: dict) -> None:  # noqa: F811
    assert status["replicas"] and status["gpus"]  # the seeded store has both
    for replica in status["replicas"]:
        assert keys_and_types(replica, ReplicaStatus) == [], replica["name"]
    assert keys_and_types(status["fleet"], FleetNumbers) == []
    for gpu in status["gpus"]:
        assert keys_and_types(gpu, GpuStatus) == []
    assert keys_and_types(status, Status) == []


def test_the_summed_status_has_the_same_records(config: Config, status: dict) -> None:  # noqa: F811
    """From the database's few rows per replica (`aggregate`): the same shapes."""
    with open_store(config.database)() as session:
        summed = build_status(session, config, now=1040.0, window=300.0, aggregate=True)
    assert keys_and_types(summed, Status) == []
    assert [list(r) for r in summed["replicas"]] == [list(r) for r in status["replicas"]]


def test_a_gone_target_has_its_records_keys(config: Config, status: dict) -> None:  # noqa: F811
    """A replica taken out of the config, not scraped since: listed under `gone`."""
    left = config.model_copy(update={"targets": [t for t in config.targets if t.name != "a"]})
    with open_store(config.database)() as session:
        later = build_status(session, left, now=1300.0, window=300.0)
    assert [g["name"] for g in later["gone"]] == ["a"]
    assert keys_and_types(later["gone"][0], GoneTarget) == []


def test_hit_rates_have_their_records_keys(config: Config, status: dict) -> None:  # noqa: F811
    with open_store(config.database)() as session:
        rates = hit_rates(session, config, 1040.0, 300.0)
    assert keys_and_types(rates, HitRates) == []
    for replica in rates["replicas"]:
        assert keys_and_types(replica, ReplicaHitRate) == []


def test_the_page_rows_have_exactly_their_records_keys(config: Config, status: dict) -> None:  # noqa: F811
    """A page's row has the window's numbers and the cost at the knee; alert evaluation's
    (`pages=False`) the window's numbers only."""
    with open_store(config.database)() as session:
        pages = build_view(session, config, 1040.0, 300.0)
        rules = build_view(session, config, 1040.0, 300.0, pages=False)
    names = [r["name"] for r in status["replicas"]]
    assert list(pages.rows) == list(rules.rows) == names
    for name in names:
        assert keys_and_types(pages.rows[name], PageNumbers) == [], name
        assert set(pages.rows[name]) == set(typing.get_type_hints(PageNumbers))
        assert keys_and_types(rules.rows[name], WindowNumbers) == [], name


def test_the_cost_at_the_knee_is_economics_fields_in_their_order() -> None:
    """KneeCost restates kneepoint.derived.cost.Economics for mypy: the same names, in order."""
    fields = [f.name for f in dataclasses.fields(Economics)]
    assert list(typing.get_type_hints(KneeCost)) == fields
    assert KneeCost.__required_keys__ == frozenset()


@pytest.mark.parametrize(
    ("block", "record"),
    [
        ({"name": "x"}, ReplicaHitRate),
        ({"name": "x", "prefix_cache_hit_rate": 0.5, "extra": 1}, ReplicaHitRate),
        ({"name": 1, "prefix_cache_hit_rate": 0.5}, ReplicaHitRate),
        ({"name": "x", "prefix_cache_hit_rate": True}, ReplicaHitRate),
    ],
)
def test_the_check_finds_a_missing_an_undeclared_and_a_mistyped_key(
    block: dict[str, Any], record: type
) -> None:
    assert keys_and_types(block, record) != []
