"""Turn a Prometheus text exposition into {sample name: [(labels, value)]}, keeping only the
series a normalizer asks for: canonical lines by a regular expression, others by the
prometheus_client parser."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from prometheus_client.parser import text_string_to_metric_families

from kneepoint.samples import Histogram

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# Series one target may expose (every sample line, kept or not): a misbehaving exporter with a
# label per request or per user would otherwise cost a round's time and memory. Targets can
# set their own (`max_series:`).
MAX_SERIES = 20_000
# Every size a normalizer derives from a label's value is bounded here, so one broken target
# costs its own scrape (ScrapeFormatError, the target down with the reason), never the memory
# or time of the round every target shares. A list built up to a label's value would cost in
# proportion to it: `position="50000000"` is a 50-million-entry list.
#
# Draft positions kept per replica (vLLM, llama.cpp, TensorRT-LLM): speculative decoding
# drafts a handful of tokens (EAGLE, MTP and n-gram configurations stop well below this).
MAX_POSITIONS = 64
# Upper bounds (`le`) of one histogram: the kept ones have 4 to 41 (tests/fixtures); TGI's
# largest, tgi_batch_next_size (not kept), has 1,025.
MAX_BUCKETS = 2_048
# The largest integer a sample holds (SQLite's INTEGER is 64-bit).
MAX_INT = 2**63 - 1
# An index label's value: ASCII digits only (str.isdigit accepts "²", which int() refuses),
# and few enough that int() never meets Python's 4,300-digit limit.
_INDEX = re.compile(r"[0-9]{1,9}")


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


class SeriesCache:
    """What earlier scrapes decided about each series line, by the line's text before its
    value (its "head": the name and label set as written), as Prometheus's scrape cache keeps
    a series by its text: a series' head does not change from scrape to scrape, its value
    does, so a line seen before costs one split and one lookup instead of the name's
    decision and the regular expression. Per head: None, an unwanted series, or the wanted
    series' canonical name, duplicate-check key and labels (shared dicts: nobody may change
    one).

    One cache serves one (wanted, rename) pair: the decisions are theirs, so it is emptied
    when called with another pair, and `wanted` must be a pure function (the TGI and
    llama.cpp normalizers note in theirs whether any of their names was seen, so they pass
    no cache). A target with a label per request would churn it: it is emptied when it
    reaches `kept` heads (about 200 bytes each)."""

    def __init__(self, kept: int = 100_000) -> None:
        self.kept = kept
        self.heads: dict[str, tuple[str, tuple[str, str], dict[str, str]] | None] = {}
        self._for: tuple[object, object] | None = None

    def for_pair(
        self, wanted: object, rename: object
    ) -> dict[str, tuple[str, tuple[str, str], dict[str, str]] | None]:
        """The heads, emptied first if they were decided for another (wanted, rename)."""
        if self._for != (wanted, rename):
            self.heads = {}
            self._for = (wanted, rename)
        elif len(self.heads) >= self.kept:
            self.heads = {}
        return self.heads


_UNKNOWN: tuple[str, tuple[str, str], dict[str, str]] = (
    "",
    ("", ""),
    {},
)  # a head not in the cache (an identity, never a real entry)


def parse_exposition(
    text: str,
    wanted: Callable[[str], bool],
    rename: Callable[[str], str] = lambda name: name,
    max_series: int = MAX_SERIES,
    cache: SeriesCache | None = None,
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

    With a `cache` (SeriesCache), a line whose head (all before its last space) an earlier
    scrape decided is read from it: skipped, or its value read by float() alone. Only what
    the paths above decide the same way for any value is kept: a comment, an unwanted
    series (decided by its name, which the head holds), and a wanted series in the
    canonical form (the expression reads its name and labels the same way whatever value
    follows). A value float() refuses, or one with "_" that float() takes and the
    expression does not, goes the usual way, which refuses it as before; a line with a
    timestamp has another head (its value is in it), so it too goes the usual way.
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
    heads = cache.for_pair(wanted, rename) if cache is not None else None
    unknown = _UNKNOWN
    for line in lines:
        if line[:1] in "#":  # a comment, or an empty line
            continue
        if heads is not None:
            head, _, value_text = line.rpartition(" ")
            known = heads.get(head, unknown)
            if known is None:  # an unwanted series, seen before
                continue
            if known is not unknown and "_" not in value_text:  # float() takes "1_0"
                try:
                    value = float(value_text)
                except ValueError:
                    pass  # the usual path below refuses it, naming the line
                else:
                    if value - value != 0.0:  # NaN or ±Inf: no usable number
                        parsed.dropped += 1
                        continue
                    kept_name, key, kept_labels = known
                    prior = seen.get(key)
                    if prior is None:
                        seen[key] = value
                        series = samples.get(kept_name)
                        if series is None:
                            samples[kept_name] = [(kept_labels, value)]
                        else:
                            series.append((kept_labels, value))
                        continue
                    if prior == value:
                        continue
                    raise ScrapeFormatError(
                        f"duplicate series {kept_name}{kept_labels} with different values "
                        f"({prior} and {value})"
                    )
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
            if heads is not None:
                _remember(heads, line, None)
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
        if heads is not None:  # the name and labels, as written
            heads[line[: match.start(2) - 1]] = (canonical, key, labels)
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


def _remember(
    heads: dict[str, tuple[str, tuple[str, str], dict[str, str]] | None],
    line: str,
    known: tuple[str, tuple[str, str], dict[str, str]] | None,
) -> None:
    """Keep what was decided for `line`'s head. A line without a space has no head (its
    name is all of it): nothing is kept, as an empty head could be any such line's."""
    head = line.rpartition(" ")[0]
    if head:
        heads[head] = known


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
    is malformed (vLLM's is read as given). More than MAX_BUCKETS bounds: ScrapeFormatError."""
    counts: dict[float, float] = {}
    known, learnt = _BOUNDS, False
    for labels, value in buckets:
        # Each bucket's `le` text read once per process (a histogram's bounds do not change
        # from scrape to scrape).
        text = labels.get("le")
        bound = known.get(text) if text is not None else None
        if bound is None:
            bound, learnt = bucket_bound(name, labels), True
        counts[bound] = counts.get(bound, 0.0) + value
    if len(counts) > MAX_BUCKETS:
        raise ScrapeFormatError(
            f"{name} has {len(counts)} bucket bounds (le), more than {MAX_BUCKETS} (MAX_BUCKETS)"
        )
    if learnt and len(known) < _BOUNDS_KEPT:  # a valid histogram's new bounds, kept
        for labels, _ in buckets:
            known[labels["le"]] = bucket_bound(name, labels)
    bounds = tuple(sorted(counts))
    if require_inf and (not bounds or bounds[-1] != math.inf):
        raise ScrapeFormatError(f"{name} has no +Inf bucket")
    return Histogram(bounds, tuple(counts[b] for b in bounds), total)


# Upper bounds by their `le` text, of valid histograms only (histogram); an exporter writing
# new bounds each scrape would grow it, so it stops growing at _BOUNDS_KEPT.
_BOUNDS: dict[str, float] = {}
_BOUNDS_KEPT = 10_000


def bucket_bound(name: str, labels: dict[str, str]) -> float:
    """A bucket's upper bound (`le`), or ScrapeFormatError saying what is wrong with it."""
    text = labels.get("le")
    if text is None:
        raise ScrapeFormatError(f"a bucket of {name} has no le label")
    try:
        bound = float(text)
    except ValueError:
        raise ScrapeFormatError(f"a bucket of {name} has le={text!r}: not a number") from None
    # NaN sorts nowhere and -Inf holds nothing: either would be stored as a bound.
    if bound != bound or bound == -math.inf:
        raise ScrapeFormatError(f"a bucket of {name} has le={text!r}: not an upper bound")
    return bound


def label_index(
    name: str, label: str, text: str | None, limit: int, what: str, limit_name: str
) -> int:
    """`text`, the value of `label` on a series of `name`, as an integer from 0 to `limit` - 1,
    or ScrapeFormatError saying `what` it should be and naming the limit (`limit_name`).
    Checked before anything is sized by it."""
    if text is None or not _INDEX.fullmatch(text) or int(text) >= limit:
        shown = text if text is None or len(text) <= 40 else text[:40] + "..."
        raise ScrapeFormatError(
            f"{name}: {label}={shown!r} is not {what} from 0 to {limit - 1} ({limit_name})"
        )
    return int(text)


def per_position(series: Series, name: str, label: str) -> list[float] | None:
    """Counts by draft position (the `label` label), added over the other labels (engines,
    processes), 0 for a position between two counted ones; None without series. A position
    of MAX_POSITIONS or more is ScrapeFormatError."""
    if not series:
        return None
    by_position: dict[int, float] = {}
    for labels, value in series:
        position = label_index(
            name, label, labels.get(label), MAX_POSITIONS, "a draft position", "MAX_POSITIONS"
        )
        by_position[position] = by_position.get(position, 0.0) + value
    return [by_position.get(position, 0.0) for position in range(max(by_position) + 1)]


def as_int(value: float, what: str) -> int:
    """`value` as an integer a sample can hold, or ScrapeFormatError: int() of an infinite
    number raises OverflowError, and beyond MAX_INT no database column holds it."""
    if not -MAX_INT <= value <= MAX_INT:  # NaN fails both comparisons
        raise ScrapeFormatError(f"{what} is {value!r}: not an integer a sample can hold")
    return int(value)


_T = TypeVar("_T")


def checked(sample: _T) -> _T:
    """`sample` (a ReplicaSample or a list of GpuSample) once every number in it is finite,
    every integer at most MAX_INT in size and a histogram's only infinite bound its last
    (+Inf); else ScrapeFormatError naming the number. The parser drops NaN and ±Inf values,
    but finite ones still add up to infinity (two engines' counters of 1e308)."""
    if not _fine(sample):  # then find the number and say where it is
        _check(sample, type(sample).__name__)
    return sample


def _fine(item: object) -> bool:
    """Whether _check would pass `item`, without the path strings it builds for its message
    (building one per number cost more than the check: this runs on every scrape)."""
    kind = type(item)
    if kind is float:
        return math.isfinite(item)  # type: ignore[arg-type]
    if item is None or kind is str or kind is bool:
        return True
    if kind is dict:
        return all(map(_fine, item.values()))  # type: ignore[attr-defined]
    if kind is list:
        return all(map(_fine, item))  # type: ignore[call-overload]
    if isinstance(item, bool | str):  # subclasses: as _check has them
        return True
    if isinstance(item, float):
        return math.isfinite(item)
    if isinstance(item, int):
        return -MAX_INT <= item <= MAX_INT
    if isinstance(item, Histogram):
        finite = item.bounds[:-1] if item.bounds[-1:] == (math.inf,) else item.bounds
        return all(map(math.isfinite, (*finite, *item.counts, item.total)))
    if isinstance(item, dict):
        return all(map(_fine, item.values()))
    if isinstance(item, list | tuple):
        return all(map(_fine, item))
    if dataclasses.is_dataclass(item):
        return all(_fine(getattr(item, entry.name)) for entry in dataclasses.fields(item))
    return True


def _check(item: object, where: str) -> None:
    if isinstance(item, bool) or item is None or isinstance(item, str):
        return
    if isinstance(item, float):
        if not math.isfinite(item):
            raise ScrapeFormatError(f"{where} is {item!r}: not a finite number (an overflow?)")
    elif isinstance(item, int):
        if not -MAX_INT <= item <= MAX_INT:
            raise ScrapeFormatError(f"{where} is {item}: beyond a 64-bit integer")
    elif isinstance(item, Histogram):
        finite = item.bounds[:-1] if item.bounds[-1:] == (math.inf,) else item.bounds
        if not all(map(math.isfinite, (*finite, *item.counts, item.total))):
            raise ScrapeFormatError(
                f"{where} has a bound, count or sum that is not finite (an overflow?)"
            )
    elif isinstance(item, dict):
        for key, value in item.items():
            _check(value, f"{where}[{key!r}]")
    elif isinstance(item, list | tuple):
        for index, value in enumerate(item):
            _check(value, f"{where}[{index}]")
    elif dataclasses.is_dataclass(item):
        for entry in dataclasses.fields(item):
            _check(getattr(item, entry.name), f"{where}.{entry.name}")
