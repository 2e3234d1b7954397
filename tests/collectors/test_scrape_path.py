"""The scrape path's caches store exactly what the path without them stores.

What earlier scrapes decided is reused (collectors/parse.py SeriesCache: each series line's
head; the histogram bounds by their `le` text), the codec writes a list of numbers in one
pass (kneepoint/store/codec.py `numbers`), the fetch keeps its connections open between
rounds (collectors/scrape.py) and `kneepoint collect` freezes its start-up objects out of
Python's collections (collectors/scheduler.py). Each is compared here with the way without
it, which the code keeps: the regular expression and prometheus_client's parser, `number()`
value by value, one connection per request.
"""

from __future__ import annotations

import math
import random
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import collectors.parse as parse
from collectors import dcgm
from collectors.collect import store_fetched
from collectors.engines import sglang, trtllm, vllm
from collectors.parse import ParsedScrape, ScrapeFormatError, SeriesCache, parse_exposition
from collectors.scrape import Fetched
from kneepoint.config import Target
from kneepoint.store import codec
from kneepoint.store.db import open_store
from tests.conftest import DCGM_L4, DCGM_T4, OWN_FIXTURES, VLLM_032, read

VLLM_CAPTURES = [
    VLLM_032,
    *sorted(OWN_FIXTURES.glob("vllm-0.32.0-*.prom")),
    OWN_FIXTURES / "vllm-0.10.2-dp2.prom",
    OWN_FIXTURES / "vllm-0.5.5-v0.prom",
]
DCGM_CAPTURES = [DCGM_L4, DCGM_T4]
# Each cached normalizer: its wanted names, renaming and cache, as its parse_* passes them.
CACHED = {
    "vllm": (vllm.WANTED.__contains__, vllm.canonical_name, vllm._SERIES),
    "sglang": (sglang.WANTED.__contains__, sglang.canonical_name, sglang._SERIES),
    "trtllm": (trtllm.WANTED.__contains__, trtllm.canonical_name, trtllm._SERIES),
    "dcgm": (dcgm._is_dcgm, lambda name: name, dcgm._SERIES),
}
CAPTURES = {
    "vllm": VLLM_CAPTURES,
    "sglang": sorted(OWN_FIXTURES.glob("sglang-*.prom")),
    "trtllm": sorted(OWN_FIXTURES.glob("trtllm-*.prom")),
    "dcgm": DCGM_CAPTURES,
}


def outcome(
    text: str,
    wanted: Callable[[str], bool],
    rename: Callable[[str], str],
    cache: SeriesCache | None,
) -> tuple[dict[str, list[tuple[dict[str, str], float]]], int] | str:
    """What parse_exposition gives: its samples and dropped count, or its error's message."""
    try:
        parsed: ParsedScrape = parse_exposition(text, wanted, rename, cache=cache)
    except ScrapeFormatError as error:
        return str(error)
    return parsed.samples, parsed.dropped


# Values a line may carry in a later scrape: ones float() reads, ones only the regular
# expression or prometheus_client refuse ("1_0", an empty one), timestamps, and garbage.
ODD_VALUES = ["0", "7", "2.5", "-0.0", "1e16", "NaN", "+Inf", "-Inf", "1_0", "", "0x1p3",
              "12 1700000000000", "3 -5", "four", "1.0\r", "٣"]  # fmt: skip


def mutated(text: str, rng: random.Random) -> str:
    """`text` with some sample lines' values changed (as a later scrape has them), some lines
    dropped and one duplicated."""
    lines = text.split("\n")
    out = []
    for line in lines:
        if line and line[0] != "#" and " " in line:
            roll = rng.random()
            if roll < 0.04:
                continue
            if roll < 0.5:
                head = line.rpartition(" ")[0]
                value = rng.choice(ODD_VALUES) if rng.random() < 0.2 else repr(rng.random() * 1e4)
                line = f"{head} {value}"
        out.append(line)
    sample_lines = [i for i, line in enumerate(out) if line and line[0] != "#"]
    if sample_lines and rng.random() < 0.3:
        out.insert(rng.choice(sample_lines), out[rng.choice(sample_lines)])
    return "\n".join(out)


@pytest.mark.parametrize("engine", CACHED)
def test_a_cached_parse_gives_what_the_uncached_parse_gives(engine: str) -> None:
    """Every capture, then many later scrapes of it with changed, odd or broken values, read
    through one cache: samples, dropped count or error as without the cache."""
    wanted, rename, _ = CACHED[engine]
    cache = SeriesCache()
    rng = random.Random(25)
    hits = 0
    for path in CAPTURES[engine]:
        text = read(path)
        for round_ in range(40):
            body = text if round_ < 2 else mutated(text, rng)
            expected = outcome(body, wanted, rename, None)
            assert outcome(body, wanted, rename, cache) == expected, (path.name, round_)
        hits += len(cache.heads)
    assert hits > 0  # the cache was used


def test_a_cache_used_with_other_names_forgets_what_it_decided() -> None:
    cache = SeriesCache()
    parse_exposition("a 1\nb 2\n", lambda name: name == "a", cache=cache)
    parsed = parse_exposition("a 1\nb 2\n", lambda name: name == "b", cache=cache)
    assert parsed.samples == {"b": [({}, 2.0)]}


def test_a_full_cache_is_emptied() -> None:
    cache = SeriesCache(kept=3)
    for n in range(10):
        parse_exposition(f'a{{x="{n}"}} 1\n', lambda name: True, cache=cache)
        assert len(cache.heads) <= 3


@settings(suppress_health_check=[HealthCheck.too_slow])  # input drawn slowly at load 40
@given(
    st.lists(
        st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**70), 2**70).map(float)
    )
)
def test_numbers_writes_what_number_writes_value_by_value(values: list[float]) -> None:
    assert codec.numbers(values) == ",".join(codec.number(v) for v in values)


@pytest.mark.parametrize(
    "values",
    [[], [0.0], [-0.0, 1.0], [1e16, 2.0], [2.0**63], [9007199254740993.0], [0.1, 10.0, 100.0],
     [math.inf], [math.nan, 3.0], [5e-324], [123456789012345.0, 0.5]],
)  # fmt: skip
def test_numbers_on_the_edges(values: list[float]) -> None:
    assert codec.numbers(values) == ",".join(codec.number(v) for v in values)


# Every stored column of what one scrape writes, ordered: the bytes compared.
DUMP = {
    "replica_samples": "SELECT * FROM replica_samples ORDER BY target_id, ts",
    "gpu_samples": "SELECT * FROM gpu_samples ORDER BY gpu_id, ts",
    "gpus": "SELECT * FROM gpus ORDER BY id",
    "histogram_layouts": "SELECT * FROM histogram_layouts ORDER BY id",
    "target_configs": "SELECT * FROM target_configs ORDER BY target_id, ts",
    "targets": "SELECT id, name, kind, up, last_error, engine, generation, engines, "
    "model_names, unavailable, cache_dtype, block_size, num_gpu_blocks, capacity_tokens, "
    "consecutive_failures, samples_refused FROM targets ORDER BY id",
}


def stored(database: Path) -> dict[str, list[tuple[object, ...]]]:
    with sqlite3.connect(database) as connection:
        return {table: connection.execute(query).fetchall() for table, query in DUMP.items()}


def store_rounds(database: Path, rounds: list[list[tuple[str, str, str]]]) -> None:
    """Store rounds of (name, kind, body) through store_fetched, 5 s apart."""
    sessions = open_store(f"sqlite:///{database}")
    for number, bodies in enumerate(rounds):
        fetched = [
            Fetched(Target(name=name, kind=kind, url=f"http://127.0.0.1:9/{name}"),
                    1_700_000_000.0 + 5 * number, 0.01, body, None)
            for name, kind, body in bodies
        ]  # fmt: skip
        outcomes = store_fetched(fetched, sessions)
        assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
    sessions.kw["bind"].dispose()


@contextmanager
def without_caches(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The path as it was: no series cache, no bounds kept, number() value by value."""
    with monkeypatch.context() as patch:
        for module in (vllm, sglang, trtllm, dcgm):
            patch.setattr(module, "_SERIES", None)
        patch.setattr(parse, "_BOUNDS", {})
        patch.setattr(parse, "_BOUNDS_KEPT", 0)
        patch.setattr(codec, "numbers", lambda values: ",".join(map(codec.number, values)))
        yield


def test_the_real_captures_are_stored_byte_for_byte_as_without_the_caches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vLLM 0.32 and DCGM captures (and older vLLM), three rounds with changed values:
    every stored row is equal, column by column, with and without the caches."""
    rng = random.Random(32)
    first = [(p.stem, "vllm", read(p)) for p in VLLM_CAPTURES] + [
        (p.stem, "dcgm", read(p)) for p in DCGM_CAPTURES
    ]
    later = [
        [(name, kind, changed_values(body, rng)) for name, kind, body in first] for _ in range(2)
    ]
    rounds = [first, *later]
    store_rounds(tmp_path / "cached.db", rounds)
    store_rounds(tmp_path / "cached-again.db", rounds)  # the caches now warm from the start
    with without_caches(monkeypatch):
        store_rounds(tmp_path / "plain.db", rounds)
    plain = stored(tmp_path / "plain.db")
    assert len(plain["replica_samples"]) == 3 * len(VLLM_CAPTURES)
    assert len(plain["gpu_samples"]) >= 3 * len(DCGM_CAPTURES)
    assert stored(tmp_path / "cached.db") == plain
    assert stored(tmp_path / "cached-again.db") == plain


def changed_values(text: str, rng: random.Random) -> str:
    """A later scrape: counters and gauges moved on by whole and fractional amounts (bucket
    counts stay cumulative: each line adds to the one before it)."""
    out, carried = [], 0.0
    for line in text.split("\n"):
        if line and line[0] != "#" and " " in line:
            head, _, value = line.rpartition(" ")
            try:
                number = float(value)
            except ValueError:
                out.append(line)
                continue
            if math.isfinite(number) and not head.endswith(("_info", "_created}")):
                carried = carried + rng.choice([0, 0, 1, 3, 0.25]) if "_bucket" in head else 0.0
                line = f"{head} {codec.number(number + carried + rng.choice([0, 1, 2.5]))}"
        out.append(line)
    return "\n".join(out)
