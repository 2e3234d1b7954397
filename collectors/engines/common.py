"""What every engine module declares (`Engine`), and the reading its normalizer shares with the
others: sums and means of series, the first of several names present, counters by label,
histograms, draft counts by position and model names.

An engine module (collectors/engines/<kind>.py) ends with `ENGINE = Engine(...)`; the package
finds it (collectors/engines/__init__.py, docs/adding-an-engine.md). This module, like the
engine modules, imports only the parser and kneepoint.samples: configuration reads the engine
kinds from here, so nothing above it (config, the store, alerts, the app) may be imported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from collectors.parse import (
    MAX_SERIES,
    ParsedScrape,
    ScrapeFormatError,
    Series,
    histogram,
    parse_exposition,
    per_position,
)
from kneepoint.samples import REPLICA_COUNTERS, REPLICA_GAUGES, Histogram, ReplicaSample

Parser = Callable[[str, int], ReplicaSample]


@dataclass(frozen=True)
class Engine:
    """One inference engine kneepoint reads.

    `kind` is the target kind in kneepoint.yaml and the `engine` of its samples; `name` is
    what sentences call it ("not exposed by llama.cpp"). `order` places it among the engines:
    in the list configuration errors show, and first when detection counts as many names for
    two engines. `prefixes` are the metric-name prefixes that only this engine writes (the
    one shown in messages first); `unprefixed` are names without a prefix that still say it
    is this engine when no engine's prefix is found. `parse` normalizes one /metrics body
    (ScrapeFormatError when it is not one). `unavailable`: the canonical quantities
    (kneepoint.samples QUANTITIES) no release of the engine gives, with the reason; its
    normalizer reports these in every sample, beside any its generation lacks. `json_body`:
    what to tell the user when `auto` meets a JSON body this engine serves in place of
    Prometheus text."""

    kind: str
    name: str
    order: int
    prefixes: tuple[str, ...]
    parse: Parser
    unavailable: Mapping[str, str] = field(default_factory=dict)
    unprefixed: frozenset[str] = frozenset()
    json_body: str | None = None


# --- the sample's parts ---------------------------------------------------------------------


def blank_numbers() -> tuple[dict[str, float | None], dict[str, float | None]]:
    """Every canonical gauge and counter, None until the normalizer finds its number."""
    return dict.fromkeys(REPLICA_GAUGES), dict.fromkeys(REPLICA_COUNTERS)


def histogram_names(bases: Iterable[str]) -> set[str]:
    """The sample names a histogram family is written as."""
    return {f"{base}_{part}" for base in bases for part in ("bucket", "sum", "count")}


# --- reading series -------------------------------------------------------------------------


def total(series: Series) -> float:
    """The values added up; 0 where there are none."""
    return sum(value for _, value in series)


def total_or_none(series: Series) -> float | None:
    """The values added up; None where there are none."""
    return sum(value for _, value in series) if series else None


def mean(series: Series) -> float | None:
    return sum(value for _, value in series) / len(series) if series else None


def maximum(series: Series) -> float | None:
    return max(value for _, value in series) if series else None


def first_present(parsed: ParsedScrape, names: Iterable[str]) -> str | None:
    """The first of `names` (a quantity's names, newest first) the scrape has."""
    samples = parsed.samples  # a plain loop: vLLM's normalizer runs this some thirty times
    for name in names:
        if name in samples:
            return name
    return None


def sum_first(parsed: ParsedScrape, names: Iterable[str]) -> float | None:
    """The sum of the first of `names` present, so a release exposing a deprecated name
    beside its replacement is counted once; None where none is present."""
    name = first_present(parsed, names)
    # A list, not a generator: the same values added in the same order, in fewer steps.
    return None if name is None else sum([value for _, value in parsed.samples[name]])


def sum_where(parsed: ParsedScrape, name: str, wanted: str, *labels: str) -> float | None:
    """A counter split by a label: the sum of the series of `name` whose label (the first of
    `labels` the series carries: engines renamed theirs) is `wanted`; None where none is."""
    values = [value for lbl, value in parsed.series(name) if _label(lbl, labels) == wanted]
    return sum(values) if values else None


def _label(labels: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        if name in labels:
            return labels[name]
    return None


def read_histograms(
    parsed: ParsedScrape,
    bases: Mapping[str, Iterable[str]],
    *,
    require_inf: bool = False,
    select: Callable[[Series], Series] | None = None,
    shown: Callable[[str], str] = lambda base: base,
) -> dict[str, Histogram]:
    """Canonical histogram -> the first of its families (newest first) that has buckets,
    counts added over label sets. `select` keeps the series to read (of ranks writing the
    same histogram, one); `shown` is the family's name in error messages; `require_inf` as
    parse.histogram. A family without buckets is not recorded yet: no histogram."""
    histograms: dict[str, Histogram] = {}
    for field_name, names in bases.items():
        bucket_name = first_present(parsed, (f"{base}_bucket" for base in names))
        if bucket_name is None:
            continue
        base = bucket_name.removesuffix("_bucket")
        buckets, sums = parsed.series(bucket_name), parsed.series(f"{base}_sum")
        if select is not None:
            buckets, sums = select(buckets), select(sums)
        histograms[field_name] = histogram(shown(base), buckets, total(sums), require_inf)
    return histograms


def by_position(parsed: ParsedScrape, name: str, label: str) -> list[float] | None:
    """Counts of `name` by draft position (its `label`), as parse.per_position."""
    return per_position(parsed.series(name), name, label)


def model_names(
    parsed: ParsedScrape,
    labels: tuple[str, ...] = ("model_name",),
    names: Iterable[str] | None = None,
    skip: tuple[str, ...] = (),
) -> list[str]:
    """The model names the series carry (in the first of `labels` each has), of the families
    `names` (every family kept where None), less the placeholders in `skip`."""
    families = parsed.samples.values() if names is None else map(parsed.series, names)
    found = set()
    for series in families:
        for lbl, _ in series:
            model = _label(lbl, labels)
            if model is not None and model not in skip:
                found.add(model)
    return sorted(found)


# --- parsing a body -------------------------------------------------------------------------


def parse_prefixed(
    text: str, prefix: str, wanted: frozenset[str], missing: str, max_series: int = MAX_SERIES
) -> ParsedScrape:
    """Parse an exposition whose engine names every family with `prefix` (llama.cpp, TGI),
    keeping `wanted`. Not one name with the prefix: ScrapeFormatError(`missing`), even when
    none of them is wanted (a scrape of other families is not this engine's)."""
    seen = False

    def keep(name: str) -> bool:
        nonlocal seen
        if name.startswith(prefix):
            seen = True
            return name in wanted
        return False

    # No SeriesCache: `keep` notes what it saw, so it is no pure function of the name.
    parsed = parse_exposition(text, keep, max_series=max_series)
    if not seen:
        raise ScrapeFormatError(missing)
    return parsed
