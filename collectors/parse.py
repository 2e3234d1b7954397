"""Turn a Prometheus text exposition into {sample name: [(labels, value)]} with the
prometheus_client parser, keeping only the series a normalizer asks for."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from kneepoint.samples import Histogram

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# Series one target may expose (every sample line, kept or not): a misbehaving exporter with a
# label per request or per user would otherwise cost a round's time and memory. Targets can
# set their own (`max_series:`).
MAX_SERIES = 20_000


class ScrapeFormatError(ValueError):
    """The body is not a usable Prometheus text exposition."""


Series = list[tuple[dict[str, str], float]]


@dataclass
class ParsedScrape:
    """Samples by name; `dropped` counts NaN/Inf values, which carry no usable number."""

    samples: dict[str, Series] = field(default_factory=dict)
    dropped: int = 0
    _seen: dict[tuple[str, frozenset[tuple[str, str]]], float] = field(
        default_factory=dict, repr=False
    )

    def series(self, name: str) -> Series:
        return self.samples.get(name, [])

    def has(self, name: str) -> bool:
        return name in self.samples


def parse_exposition(
    text: str,
    wanted: Callable[[str], bool],
    rename: Callable[[str], str] = lambda name: name,
    max_series: int = MAX_SERIES,
) -> ParsedScrape:
    """Parse `text`, keeping samples whose (renamed) name `wanted` accepts.

    Lines of unwanted series are skipped before the parser sees them: parsing is the cost
    of a scrape, and a vLLM capture is two thirds series nobody reads (`_created`, buckets
    of histograms we keep only as sum and count, process and HTTP metrics). Every line's
    name is still checked, so an HTML page or garbage is an error, not an empty scrape.
    A body with more than `max_series` sample lines is refused before anything is parsed.
    """
    if not text.strip():
        raise ScrapeFormatError("the response body is empty")
    if not text.endswith("\n"):
        raise ScrapeFormatError("the response ends mid-line (truncated body)")
    kept: list[str] = []
    count = 0
    for number, line in enumerate(text.split("\n"), start=1):
        if not line or line[0] == "#":
            continue
        count += 1
        if count > max_series:
            raise ScrapeFormatError(
                f"more than {max_series} series (max_series); a label per request or user?"
            )
        name = line.partition(" ")[0].partition("{")[0]
        canonical = rename(name)
        if wanted(canonical):
            kept.append(line if canonical is name else canonical + line[len(name) :])
        elif not _METRIC_NAME.fullmatch(name):
            raise ScrapeFormatError(f"line {number} is not a metric sample: {line[:60]!r}")
    parsed = ParsedScrape()
    try:
        families = text_string_to_metric_families("\n".join(kept) + "\n")
        for family in families:
            for sample in family.samples:
                _add(parsed, sample.name, sample.labels, sample.value)
    except ValueError as error:
        raise ScrapeFormatError(f"malformed exposition: {error}") from error
    return parsed


def _add(parsed: ParsedScrape, name: str, labels: dict[str, str], value: float) -> None:
    # The parser gives an int for a value written without a decimal point ("0", as DCGM and
    # Prometheus's API write them): every stored number is a float.
    value = float(value)
    if not math.isfinite(value):
        parsed.dropped += 1
        return
    key = (name, frozenset(labels.items()))
    seen = parsed._seen.get(key)
    if seen is not None:
        # An identical repeat is harmless; two values for one series make both untrustworthy.
        if seen != value:
            raise ScrapeFormatError(
                f"duplicate series {name}{labels} with different values ({seen} and {value})"
            )
        return
    parsed._seen[key] = value
    parsed.samples.setdefault(name, []).append((labels, value))


def histogram(name: str, buckets: Series, total: float, require_inf: bool = False) -> Histogram:
    """A cumulative histogram from its `_bucket` series, counts added over label sets that
    share an upper bound (engines, ranks). `require_inf`: a histogram without its +Inf bucket
    is malformed (vLLM's is read as given)."""
    counts: dict[float, float] = {}
    for labels, value in buckets:
        bound = bucket_bound(name, labels)
        counts[bound] = counts.get(bound, 0.0) + value
    bounds = tuple(sorted(counts))
    if require_inf and (not bounds or bounds[-1] != math.inf):
        raise ScrapeFormatError(f"{name} has no +Inf bucket")
    return Histogram(bounds, tuple(counts[b] for b in bounds), total)


def bucket_bound(name: str, labels: dict[str, str]) -> float:
    """A bucket's upper bound (`le`), or ScrapeFormatError saying what is wrong with it."""
    text = labels.get("le")
    if text is None:
        raise ScrapeFormatError(f"a bucket of {name} has no le label")
    try:
        return float(text)
    except ValueError:
        raise ScrapeFormatError(f"a bucket of {name} has le={text!r}: not a number") from None
