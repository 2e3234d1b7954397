"""Turn a Prometheus text exposition into {sample name: [(labels, value)]}, keeping only the
series a normalizer asks for: canonical lines by a regular expression, others by the
prometheus_client parser."""

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
    # Series seen, for the duplicate check: by (name, label text) for lines in the canonical
    # form, by (name, frozenset of labels) for the others.
    _seen: dict[tuple[str, str | frozenset[tuple[str, str]]], float] = field(
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

    Lines of unwanted series are skipped before they are parsed: parsing is the cost of a
    scrape, and a vLLM exposition is four fifths series nobody reads (`_created`, buckets of
    histograms we keep only as sum and count, process and HTTP metrics). Every line's name is
    still checked, so an HTML page or garbage is an error, not an empty scrape. A body with
    more than `max_series` sample lines is refused before anything is stored.

    A wanted line in the canonical form exporters write (`name{a="b",c="d"} value [ms]`, no
    escapes) is read by one regular expression; any other line (escapes, spaces in the label
    set, exemplars, a malformed line) goes to prometheus_client's parser, which accepts or
    refuses it as it always did. The fast path is five times cheaper (bench_prometheus.py).
    """
    if not text or text.isspace():
        raise ScrapeFormatError("the response body is empty")
    if text[-1] != "\n":
        raise ScrapeFormatError("the response ends mid-line (truncated body)")
    lines = text.split("\n")
    if len(lines) > max_series and _sample_lines(lines) > max_series:
        raise ScrapeFormatError(
            f"more than {max_series} series (max_series); a label per request or user?"
        )
    parsed = ParsedScrape()
    decided: dict[str, str | None] = {}  # a line's name -> its canonical name, None: unwanted
    canonical_form, label_pairs = _CANONICAL_REST.fullmatch, _LABEL_PAIR.findall
    seen, samples, label_sets = parsed._seen, parsed.samples, _LABEL_SETS
    for line in lines:
        if line[:1] in "#":  # a comment, or an empty line
            continue
        name = line.partition(" ")[0].partition("{")[0]
        if name in decided:
            canonical = decided[name]
        else:
            renamed = rename(name)
            if wanted(renamed):
                canonical = decided[name] = renamed
            elif _METRIC_NAME.fullmatch(name):
                canonical = decided[name] = None
            else:
                number = lines.index(line) + 1
                raise ScrapeFormatError(f"line {number} is not a metric sample: {line[:60]!r}")
        if canonical is None:
            continue
        match = canonical_form(line, len(name))
        if match is None:
            _parse_line(parsed, canonical + line[len(name) :])
            continue
        labels_text, value_text = match.groups()
        labels_text = labels_text or ""
        try:
            value = float(value_text)
        except ValueError:
            number = lines.index(line) + 1
            raise ScrapeFormatError(
                f"malformed exposition: line {number} has value {value_text!r}"
            ) from None
        if value - value != 0.0:  # NaN or ±Inf: no usable number
            parsed.dropped += 1
            continue
        labels = label_sets.get(labels_text)
        if labels is None:
            if len(label_sets) >= _LABEL_SETS_KEPT:
                label_sets.clear()
            labels = label_sets[labels_text] = dict(label_pairs(labels_text))
        # _add's duplicate check, inline (this runs for every kept line of every scrape), on
        # the label text as written: exporters write a series' labels in one order.
        key = (canonical, labels_text)
        prior = seen.get(key)
        if prior is None:
            seen[key] = value
            series = samples.get(canonical)
            if series is None:
                samples[canonical] = [(labels, value)]
            else:
                series.append((labels, value))
        elif prior != value:
            raise ScrapeFormatError(
                f"duplicate series {canonical}{labels} with different values ({prior} and {value})"
            )
    return parsed


_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"'
# What follows the name on a canonical line: labels without escapes, a value (the "_" Python
# would accept in a number is refused by prometheus_client too), an integer timestamp.
_CANONICAL_REST = re.compile(
    rf"(?:\{{((?:{_LABEL}(?:,{_LABEL})*,?)?)\}})? ([^ _\n]+)(?: -?[0-9]+)?"
)
_LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')
# Label sets by their text, kept from scrape to scrape (as Prometheus's scrape cache keeps a
# series by its text): a series' labels do not change between scrapes, its value does, so
# most lines' labels are not read again. The dicts are shared: nobody may change one. A
# target with a label per request would churn it; it is emptied when it reaches the cap.
_LABEL_SETS: dict[str, dict[str, str]] = {}
_LABEL_SETS_KEPT = 100_000


def _sample_lines(lines: list[str]) -> int:
    """How many of `lines` are samples (not comments, not empty)."""
    return sum(1 for line in lines if line[:1] not in "#")


def _parse_line(parsed: ParsedScrape, line: str) -> None:
    """One line that is not in the canonical form, read by prometheus_client's parser."""
    try:
        for family in text_string_to_metric_families(line + "\n"):
            for sample in family.samples:
                _add(parsed, sample.name, sample.labels, sample.value)
    except ValueError as error:
        raise ScrapeFormatError(f"malformed exposition: {error}") from error


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
