"""What SLOs read, kept as running sums per target and 5-minute bucket, as Prometheus
recording rules keep them: a burn-rate round adds up a few rows per replica instead of
reading days of samples (alerts/evaluate.py `measure`).

Per target and bucket (aligned to the epoch), for the availability counters (AVAILABILITY)
and every latency histogram's cumulative bucket counts and count (HISTOGRAMS):

- `inner`: the increases between consecutive samples both inside the bucket;
- the entry step: from the target's previous sample (in an earlier bucket) into the bucket's
  first sample, resets handled as kneepoint/counters.increase does (a value that went down
  is the increase);
- `sums`: the running sum of both over every bucket written for the target, plus its sample
  count and observed seconds (the gaps between consecutive samples);
- `last`: the raw values at its last sample, for the step into the next samples.

So the increase over samples s_i..s_j is sums(bucket of s_j) − sums(bucket of s_i) when s_i
is its bucket's last sample, and a window's increase is read from a partial bucket at each
end (raw rows) plus two rows per target. A histogram's window counts are the sum of the
per-bound increases, made cumulative once at the end (kneepoint/derived/latency.py
window_histogram does the same over the window's samples).

The sums are exact only where every sample of a stretch knew the same counters and read
the same histogram layout: `sig` says which, and `breaks` counts the buckets where it
changed (inside the bucket, or from the previous sample); a reader falls back to the samples
for a target whose window holds one. Like the direct computation, histograms are decoded at
a bucket's ends and around counter resets only: between those their counts grow.

Stalled seconds (availability SLOs) are a running sum too (`st`), so a burn-rate round reads
no stall rows. Stall detection (kneepoint/derived/stall.py `stuck`) walks each target's raw
samples in time order across buckets, its state carried from one to the next in `last`
(`w`: the last sample's queues and progress counters, the start of the run of stuck pairs it
ends, and whether that run has lasted the engine-stalled rule's `for`; `wi`: the state
entering the bucket). A run is credited all it lasted so far at the sample where it has
lasted `for`, then each later step at the sample that ends it; `st` sums the credits at a
bucket's samples (`inner`) and over every bucket (`sums`). A window's stalled seconds are
the credits at its samples: the whole buckets' from the sums, and its partial buckets walked
again from the state entering them (the same credits as the writer's: the widest gap a
stuck pair may span is the bucket's, max(stale_after, twice its median step)).

Against the direct computation (alerts/evaluate.py `_stalled_seconds` over the window's
rows) runs are judged whole and on raw samples, so:
- a window of raw samples (an hour and less) that no run crosses the start of gets the same
  seconds. A run open at its end is judged on what it lasted so far, as there;
- a run that crosses the window's start is cut there by the direct computation (what is
  left must last `for` on its own); the sums count its steps from the pair that spans the
  start, and, if it reached `for` inside the window, what it lasted before (less than
  `for`): they differ by at most `for` and one step;
- over an hour the direct computation judges summary rows, 5 minutes apart (an hour past 2
  days): it sees a run's ends to within a summary step, or misses a short run: the sums
  differ by at most two summary steps a run, and `for` and a step.
tests/alerts/test_slo_sums.py (test_stalled_seconds_from_the_sums) checks all three. Rows
written before the sums kept stalls have no `st` (None): a window that needs one reads the
candidate rows (stall_rows) as before, and the running sum starts again at the first bucket
written since."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np
import pandas as pd
from sqlalchemy import (
    ARRAY,
    Integer,
    Table,
    and_,
    any_,
    case,
    delete,
    func,
    literal,
    select,
    union_all,
)
from sqlalchemy.orm import Session

from kneepoint.derived import stall
from kneepoint.samples import HISTOGRAMS, REPLICA_COUNTERS
from kneepoint.store import queries
from kneepoint.store.codec import decode_histogram
from kneepoint.store.models import ReplicaSampleRow, SloSumProgressRow, SloSumRow, TargetRow

BUCKET = 300.0
BUDGET = 2400  # target-buckets one advance writes at most (see advance)
SETTLE = 60.0  # a bucket is summed this long after it ends: scrapes in flight land first
PROGRESS = "slo_sums"
FINISHED = ("stop", "length", "abort", "error", "repetition")
AVAILABILITY = (
    *(f"requests_finished_{r}" for r in FINISHED),
    "http_requests",
    "http_requests_5xx",
    "admission_rejections",  # refused at admission: failed requests (alerts/slo.py)
)
SAMPLES = cast(Table, ReplicaSampleRow.__table__)
SUMS = cast(Table, SloSumRow.__table__)
# A sample's columns the sums read: every counter (resets are found on all of them, as
# kneepoint/derived/window.py finds them) and the encoded histograms.
COLUMNS = tuple(dict.fromkeys((*REPLICA_COUNTERS, *AVAILABILITY)))
HIST_COLUMNS = tuple(f"hist_{name}" for name in HISTOGRAMS)
# What stall detection reads besides the progress counters (in COLUMNS): stall.Point's order.
QUEUES = ("requests_running", "requests_waiting")
STALL = (*QUEUES, *stall.PROGRESS, "sleep_level")
READ = (*COLUMNS, *QUEUES, "sleep_level", *HIST_COLUMNS)

Values = dict[str, Any]  # {"c": {counter: float | None}, "h": {histogram: [counts…, total] | None}}


@dataclass
class Part:
    """Increases over a stretch of one target's samples (or the running sums up to one)."""

    n: int = 0  # samples
    s: float = 0.0  # seconds between consecutive samples
    c: dict[str, float] = field(default_factory=dict)
    h: dict[str, list[float]] = field(default_factory=dict)
    # Stalled seconds credited at these samples (module docstring, "Stalled seconds"); None:
    # not known (a row written before the sums kept them).
    st: float | None = 0.0

    def to_json(self) -> str:
        return json.dumps({"n": self.n, "s": self.s, "c": self.c, "h": self.h, "st": self.st})

    @staticmethod
    def from_json(text: str) -> Part:
        data = json.loads(text)
        return Part(data["n"], data["s"], data["c"], data["h"], data.get("st"))

    def plus(self, other: Part, sign: float = 1.0) -> Part:
        """self + sign × other; a histogram only one side has is taken from it (a layout
        changed: never read, as the change is a break)."""
        h = dict(self.h)
        for name, counts in other.h.items():
            mine = h.get(name)
            if mine is not None and len(mine) == len(counts):
                h[name] = [a + sign * b for a, b in zip(mine, counts, strict=True)]
            else:
                h[name] = [sign * b for b in counts]
        c = dict(self.c)
        for name, value in other.c.items():
            c[name] = c.get(name, 0.0) + sign * value
        st = None if self.st is None or other.st is None else self.st + sign * other.st
        return Part(self.n + int(sign) * other.n, self.s + sign * other.s, c, h, st)


@dataclass(frozen=True)
class Run:
    """Stall detection's state at one sample: the sample's queues and progress counters
    (stall.Point's order), and the run of stuck pairs it ends, if any: the run's first
    sample's time and whether the run has lasted `after` already (its seconds credited)."""

    ts: float
    point: tuple[float | None, ...]
    start: float | None = None
    qualified: bool = False

    def to_json(self) -> list[Any]:
        return [self.ts, list(self.point), self.start, self.qualified]

    @staticmethod
    def from_json(data: list[Any] | None) -> Run | None:
        if data is None:
            return None
        return Run(float(data[0]), _padded(tuple(data[1])), data[2], bool(data[3]))


@dataclass(frozen=True)
class StallRule:
    """How stalls are judged: the engine-stalled rule's `for` (status.stall_after) and the
    floor of the widest gap a stuck pair may span (status.stale_after)."""

    after: float = stall.STALL_AFTER
    floor: float = 0.0


DEFAULT_RULE = StallRule()


@dataclass
class Carry:
    """A target's state at its last sample summed so far."""

    last_ts: float
    sig: str
    values: Values
    sums: Part
    breaks: int
    run: Run | None = None  # stall detection's state at that sample


def among(session: Session, column: Any, ids: Sequence[int]) -> Any:
    """`column IN ids`; on PostgreSQL `column = ANY(array)`, one parameter rather than one
    per id: psycopg parses a COPY statement's parameters in Python, 50 ms for one with
    200 replicas' ids in each of its pieces (the same plan: PostgreSQL reads an IN list as
    = ANY)."""
    if session.get_bind().dialect.name == "postgresql":
        return column == any_(literal([int(i) for i in ids], ARRAY(Integer)))
    return column.in_([int(i) for i in ids])


def step(earlier: float, later: float) -> float:
    return later - earlier if later >= earlier else later  # went down: a reset


def _steps(earlier: list[float], later: list[float]) -> list[float]:
    return [step(a, b) for a, b in zip(earlier, later, strict=True)]


def _hist(text: object, layouts: dict[int, tuple[float, ...]]) -> list[float] | None:
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return None
    decoded = decode_histogram(str(text), layouts)
    return [*decoded.counts, decoded.total]


def _layout(text: object) -> str:
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return ""
    return str(text).split("|", 1)[0]


def signatures(frame: pd.DataFrame) -> list[str]:
    """Per row: which availability counters it knows, and each histogram's layout."""
    known = frame[list(AVAILABILITY)].notna().to_numpy()
    # Each row's known counters as one number, then written once per number seen.
    codes = (known * (1 << np.arange(known.shape[1]))).sum(axis=1).tolist()
    bits = {
        code: "".join("1" if code >> i & 1 else "0" for i in range(known.shape[1]))
        for code in set(codes)
    }
    layouts = [
        [t.split("|", 1)[0] if isinstance(t, str) else "" for t in frame[c].tolist()]
        for c in HIST_COLUMNS
    ]
    return [f"{bits[k]}|{','.join(parts)}" for k, *parts in zip(codes, *layouts, strict=True)]


@dataclass
class _Rows:
    """A frame's columns as plain lists, converted once (pandas per bucket costs more)."""

    ts: list[float]
    sigs: list[str]
    values: dict[str, list[float]]  # NaN where unknown
    texts: dict[str, list[Any]]
    went_down: list[bool]  # a counter went down from the target's previous row
    stall: list[tuple[float | None, ...]]  # STALL per row (None: unknown)
    # stall.stuck(previous row, this row) but for the gap test, where the previous row is
    # the same target's (vectorized: a walk reads it instead of calling stuck per pair).
    stuck: list[bool]

    @staticmethod
    def of(frame: pd.DataFrame, parts: pd.Series | None = None) -> _Rows:
        """`parts`: a label per row; a target's rows under different labels are separate
        stretches (a reset is looked for within each)."""
        values = frame[list(COLUMNS)].astype(float)
        groups = [frame.target_id] if parts is None else [frame.target_id, parts]
        down = _went_down(values, groups)
        known = [c for c in STALL if c in frame]
        read = frame[known].astype(float).to_numpy().tolist() if known else [[]] * len(frame)
        stuck = _stuck_pairs(frame, known, groups)
        at = [known.index(c) if c in known else None for c in STALL]
        points = [
            tuple(None if i is None or math.isnan(row[i]) else row[i] for i in at) for row in read
        ]
        return _Rows(
            frame.ts.astype(float).tolist(),
            signatures(frame),
            {name: values[name].tolist() for name in AVAILABILITY},
            {c: frame[c].tolist() for c in HIST_COLUMNS},
            down.tolist(),
            points,
            stuck,
        )


def _went_down(values: pd.DataFrame, groups: list[Any]) -> pd.Series:
    """Per row: did a counter go down from the group's last row that knew it (a reset)?"""
    return (values.groupby(groups).ffill().groupby(groups).diff() < 0).any(axis=1)


def _stuck_pairs(frame: pd.DataFrame, known: list[str], groups: list[Any]) -> list[bool]:
    """Per row: is it and the row before it of the same group a stuck pair (stall.stuck
    without its gap test)? Work present at both (unknown queues count as none), a progress
    counter known at both, and none known at both that differs."""
    queues = [c for c in QUEUES if c in known]
    progress = [c for c in stall.PROGRESS if c in known]
    if not queues or not progress:
        return [False] * len(frame)
    values = frame[known].astype(float)
    before = values.groupby(groups).shift(1)  # NaN at a group's first row: no pair
    work = values[queues].fillna(0.0).sum(axis=1) > 0
    worked = before[queues].fillna(0.0).sum(axis=1) > 0
    if "sleep_level" in known:  # an asleep engine is not busy (stall.busy)
        work &= ~(values["sleep_level"] > 0)
        worked &= ~(before["sleep_level"] > 0)
    both = values[progress].notna() & before[progress].notna()
    same = (~both | (values[progress] == before[progress])).all(axis=1)
    return (work & worked & both.any(axis=1) & same).tolist()


# The increases within a stretch of samples, the step into it, the values at its last sample,
# each sample's signature, and the stalled seconds credited at each sample (time, seconds).
Stretch = tuple[Part, Part, Values, list[str], list[tuple[float, float]]]


def max_gap(ts: Sequence[float], before: float | None, rule: StallRule) -> float:
    """The widest gap a stuck pair may span, as evaluate._stalled_seconds takes it (the
    larger of the floor and twice the median step), the median over the pairs one stretch
    walks (a bucket's, the step into its first sample included): the writer and a reader
    of the same bucket get the same."""
    times = list(ts) if before is None else [before, *ts]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return max(rule.floor, 2 * statistics.median(gaps)) if gaps else rule.floor


def walk(
    rows: _Rows, first: int, end: int, run: Run | None, after: float, widest: float
) -> tuple[float, Run | None, list[float]]:
    """Stall detection over rows first..end-1, from `run` (the state at the sample before;
    None: none): the seconds credited (in all, and at each sample) and the state at the
    last. A stuck pair (stall.stuck) extends the run; a run is credited its seconds once it
    has lasted `after` (all it lasted so far, at the sample where it does), and each later
    pair's as it comes."""
    credits: list[float] = []
    for i in range(first, end):
        ts, point = rows.ts[i], rows.stall[i]
        credit = 0.0
        if run is None:
            paired = False
        elif i > first:  # the row before is this stretch's: its pair, judged already
            paired = rows.stuck[i] and ts - run.ts <= widest
        else:
            earlier = stall.Point(run.ts, *run.point)
            paired = stall.stuck(earlier, stall.Point(ts, *point), widest)
        if run is not None and paired:
            start = run.ts if run.start is None else run.start
            if run.qualified:
                credit = ts - run.ts
            elif ts - start >= after:
                credit = ts - start
            run = Run(ts, point, start, run.qualified or ts - start >= after)
        else:
            run = Run(ts, point)
        credits.append(credit)
    return sum(credits), run, credits


def stretch(
    rows: pd.DataFrame,
    layouts: dict[int, tuple[float, ...]],
    before: Carry | None = None,
    rule: StallRule = DEFAULT_RULE,
) -> Stretch:
    """One target's samples (time order, not empty): the increases between them, the entry
    step from `before` (its last sample) into the first, the raw values at the last, the
    rows' signatures and the first sample's time. Histograms are decoded at the ends and
    around counter resets only."""
    return _stretch(_Rows.of(rows), 0, len(rows), layouts, before, rule)


def stretches(
    frame: pd.DataFrame,
    layouts: dict[int, tuple[float, ...]],
    before: dict[int, Carry] | None = None,
    rule: StallRule = DEFAULT_RULE,
) -> dict[int, Stretch]:
    """`stretch` for every target of `frame` (ordered by target and time), each from its
    `before`: the columns are converted once for the whole frame, as pandas costs about
    the same for a few rows as for a thousand (a window's partial buckets at 1,000
    replicas are 2,000 such stretches)."""
    if frame.empty:
        return {}
    frame = frame.reset_index(drop=True)
    carries = before or {}
    # One group per target, its stretch all its rows: `heads`' passes with a start before
    # every row, the stall state entering each from its carry.
    keys = pd.Series(0.0, index=frame.index)
    targets = list(dict.fromkeys(frame.target_id.astype(int).tolist()))
    entering = {(0.0, t): getattr(carries.get(t), "run", None) for t in targets}
    found, walked = _plain_heads(frame, keys, layouts, {0.0: -math.inf}, entering, {}, carries)
    out = {target_id: stretch for (_, target_id), stretch in found.items()}
    if walked.any():
        out |= stretches_walked(frame[walked], layouts, before, rule)
    return {t: out[t] for t in targets}  # in the frame's order, as the walk gives them


def stretches_walked(
    frame: pd.DataFrame,
    layouts: dict[int, tuple[float, ...]],
    before: dict[int, Carry] | None = None,
    rule: StallRule = DEFAULT_RULE,
) -> dict[int, Stretch]:
    """`stretches`, each target's samples walked one by one (`_stretch`): the reference the
    vectorized passes are tested against, and the path of the targets they leave."""
    if frame.empty:
        return {}
    frame = frame.reset_index(drop=True)
    rows = _Rows.of(frame)
    targets = frame.target_id.astype(int).tolist()
    out: dict[int, Stretch] = {}
    first = 0
    for end in range(1, len(targets) + 1):
        if end < len(targets) and targets[end] == targets[first]:
            continue
        out[targets[first]] = _stretch(
            rows, first, end, layouts, (before or {}).get(targets[first]), rule
        )
        first = end
    return out


def heads(
    frame: pd.DataFrame,
    layouts: dict[int, tuple[float, ...]],
    buckets: list[float],
    starts: dict[float, float],
    entering: dict[tuple[float, int], Run | None],
    rule: StallRule = DEFAULT_RULE,
    lasts: dict[tuple[float, int], tuple[float, Values]] | None = None,
) -> dict[tuple[float, int], Stretch]:
    """The stretch from `starts[bucket]` to the bucket's end of each target's samples in
    each of `buckets` (`buckets` labels each row of `frame`, whole buckets ordered by target
    and time), by (bucket, target), for those with samples there: one conversion for every
    bucket (a round's windows' partial start buckets are read together: alerts/evaluate.py
    `_heads`). Stall detection walks the whole bucket from `entering` (the state entering
    it, as its sums row keeps it: the writer's walk, so the same credits), and the stretch's
    `st` is what it credits from the start on (None where `entering` has no entry: a row
    written before the sums kept stalls). `lasts`: the sums row's last_ts and `last` per
    (bucket, target), whose histograms are the bucket's last sample's, decoded already.

    Nearly every stretch holds no counter reset, one signature and no pair of samples that
    may be stuck: those are found and summed in vectorized passes over all of them at once
    (`_plain_heads`; at 1,000 replicas a round's windows start in 7,000 such stretches);
    only the rest are walked sample by sample (`heads_walked`), the same numbers."""
    if frame.empty:
        return {}
    frame = frame.reset_index(drop=True)
    keys = pd.Series(buckets, index=frame.index, dtype=float)
    out, walked = _plain_heads(frame, keys, layouts, starts, entering, lasts or {})
    if walked.any():
        rest = frame[walked].reset_index(drop=True)
        out |= heads_walked(rest, layouts, keys[walked].tolist(), starts, entering, rule, lasts)
    return out


def heads_walked(
    frame: pd.DataFrame,
    layouts: dict[int, tuple[float, ...]],
    buckets: list[float],
    starts: dict[float, float],
    entering: dict[tuple[float, int], Run | None],
    rule: StallRule = DEFAULT_RULE,
    lasts: dict[tuple[float, int], tuple[float, Values]] | None = None,
) -> dict[tuple[float, int], Stretch]:
    """`heads`, each stretch walked sample by sample (`_stretch`): the reference the
    vectorized passes are tested against, and the path of stretches they leave."""
    if frame.empty:
        return {}
    frame = frame.reset_index(drop=True)
    rows = _Rows.of(frame, pd.Series(buckets, index=frame.index))
    keys = list(zip(buckets, frame.target_id.astype(int).tolist(), strict=True))
    out: dict[tuple[float, int], Stretch] = {}
    first = 0
    for end in range(1, len(keys) + 1):
        if end < len(keys) and keys[end] == keys[first]:
            continue
        key, since = keys[first], starts[keys[first][0]]
        head = next((i for i in range(first, end) if rows.ts[i] >= since), end)
        if head < end:
            known = key in entering
            run = entering.get(key)
            widest = max_gap(rows.ts[first:end], None if run is None else run.ts, rule)
            _, run, _ = walk(rows, first, head, run, rule.after, widest)
            last_ts, last = (lasts or {}).get(key, (None, None))
            known_last = last if last_ts == rows.ts[end - 1] else None
            found = _stretch(rows, head, end, layouts, None, rule, (run, widest), known_last)
            if not known:
                found[0].st = None
            out[key] = found
        first = end
    return out


def _plain_heads(
    frame: pd.DataFrame,
    keys: pd.Series,
    layouts: dict[int, tuple[float, ...]],
    starts: dict[float, float],
    entering: dict[tuple[float, int], Run | None],
    lasts: dict[tuple[float, int], tuple[float, Values]],
    carries: dict[int, Carry] | None = None,
) -> tuple[dict[tuple[float, int], Stretch], np.ndarray]:
    """`heads` for every (bucket, target) group of `frame` (index 0..n-1, `keys` its rows'
    buckets) whose stretch from the window's start holds no counter reset and one signature,
    and whose bucket holds no pair of samples that may be stuck (the pair entering it from
    `entering` included, judged without the gap test: a wider gap only unsticks a pair).
    There stall detection credits nothing and every count's increase is its last value
    less its first, so no walk is needed. Returns those stretches and, per row, whether its
    group is left to be walked (`heads_walked`)."""
    n = len(frame)
    ts = frame.ts.to_numpy(dtype=float)
    targets = frame.target_id.to_numpy(dtype=np.int64)
    buckets = keys.to_numpy(dtype=float)
    new = np.ones(n, dtype=bool)
    new[1:] = (targets[1:] != targets[:-1]) | (buckets[1:] != buckets[:-1])
    group = np.cumsum(new) - 1
    firsts = np.flatnonzero(new)
    ends = np.append(firsts[1:], n)
    count = len(firsts)
    since = np.array([starts[b] for b in buckets[firsts].tolist()], dtype=float)
    inside = ts >= since[group]  # a suffix of each group: rows are in time order
    heads = ends - np.bincount(group, weights=inside, minlength=count).astype(np.int64)
    found = heads < ends
    head_row = np.zeros(n, dtype=bool)
    head_row[heads[found]] = True
    groups = [frame.target_id, keys]
    down = _went_down(frame[list(COLUMNS)].astype(float), groups).to_numpy(dtype=bool)
    known = [c for c in STALL if c in frame]
    stuck = np.asarray(_stuck_pairs(frame, known, groups), dtype=bool)
    sigs = np.full(n, "", dtype=object)
    sigs[inside] = signatures(frame[inside])
    mixed = inside & (sigs != sigs[np.minimum(heads, n - 1)[group]])
    bad = (down & inside & ~head_row) | mixed | stuck
    walk_group = np.bincount(group, weights=bad, minlength=count) > 0
    # The stall state entering the bucket against its first sample: stall.stuck, no gap test.
    stall_values = np.full((n, len(STALL)), np.nan)
    for i, column in enumerate(STALL):
        if column in frame:
            stall_values[:, i] = frame[column].to_numpy(dtype=float)
    group_keys = list(zip(buckets[firsts].tolist(), targets[firsts].tolist(), strict=True))
    runs = [entering.get(key) for key in group_keys]
    with_run = np.array([run is not None for run in runs], dtype=bool)
    if with_run.any():
        # A state kept before the sums read the sleep level has none: unknown (awake).
        before = np.array(
            [
                [np.nan if v is None else v for v in _padded(run.point)]
                for run in runs
                if run is not None
            ],
            dtype=float,
        ).reshape(-1, len(STALL))
        after = stall_values[firsts[with_run]]
        queues, last = len(QUEUES), len(QUEUES) + len(stall.PROGRESS)
        # Asleep at either end: not busy, as stall.busy reads it.
        busy = (
            (np.nan_to_num(before[:, :queues]).sum(axis=1) > 0)
            & (np.nan_to_num(after[:, :queues]).sum(axis=1) > 0)
            & ~(before[:, last] > 0)
            & ~(after[:, last] > 0)
        )
        both = ~np.isnan(before[:, queues:last]) & ~np.isnan(after[:, queues:last])
        same = (~both | (before[:, queues:last] == after[:, queues:last])).all(axis=1)
        walk_group[with_run] |= busy & both.any(axis=1) & same
    walk_group &= found
    plain = np.flatnonzero(found & ~walk_group)
    return _plain_stretches(
        frame,
        plain,
        firsts,
        heads,
        ends,
        group_keys,
        runs,
        sigs,
        stall_values,
        layouts,
        entering,
        lasts,
        carries,
    ), walk_group[group]


def _plain_stretches(
    frame: pd.DataFrame,
    plain: np.ndarray,
    firsts: np.ndarray,
    heads: np.ndarray,
    ends: np.ndarray,
    group_keys: list[tuple[float, int]],
    runs: list[Run | None],
    sigs: np.ndarray,
    stall_values: np.ndarray,
    layouts: dict[int, tuple[float, ...]],
    entering: dict[tuple[float, int], Run | None],
    lasts: dict[tuple[float, int], tuple[float, Values]],
    carries: dict[int, Carry] | None = None,
) -> dict[tuple[float, int], Stretch]:
    """The Stretch `_stretch` gives each group of `plain` (`_plain_heads`' groups): every
    count's first and last known value in the stretch taken for all groups at once.
    `carries`: each target's state before its group (`stretches`), whose step into the
    first sample is the entry step."""
    out: dict[tuple[float, int], Stretch] = {}
    if not len(plain):
        return out
    h, e = heads[plain], ends[plain]
    ts = frame.ts.to_numpy(dtype=float)
    label = np.full(len(frame), -1, dtype=np.int64)
    for g, (a, b) in enumerate(zip(h.tolist(), e.tolist(), strict=True)):
        label[a:b] = g
    inside = label >= 0
    values = frame.loc[inside, list(AVAILABILITY)].astype(float)
    by = values.groupby(label[inside], sort=True)
    first, last, known = by.first(), by.last(), by.count()
    increase = (last - first).where(known >= 2, 0.0)
    # Per group, in AVAILABILITY's order (plain lists: pandas per group costs more).
    increases_c = increase[list(AVAILABILITY)].to_numpy().tolist()
    lasts_c = last[list(AVAILABILITY)].to_numpy().tolist()
    firsts_c = first[list(AVAILABILITY)].to_numpy().tolist()
    all_ts = ts.tolist()
    hl, el, fl, indices = h.tolist(), e.tolist(), firsts.tolist(), plain.tolist()
    # The sums row's last values where they are the stretch's last sample's.
    kept: list[Values | None] = []
    for g, index in enumerate(indices):
        last_ts, known_last = lasts.get(group_keys[index], (None, None))
        kept.append(known_last if last_ts == all_ts[el[g] - 1] else None)
    hists: dict[str, tuple[list[list[float] | None], list[list[float] | None]]] = {}
    for name, column in zip(HISTOGRAMS, HIST_COLUMNS, strict=True):
        texts = frame[column].to_numpy(dtype=object)
        ending: list[list[float] | None] = []
        for known_last, text in zip(kept, texts[e - 1].tolist(), strict=True):
            given = None if known_last is None else known_last["h"].get(name)
            # The bucket's last sample: its sums row keeps its histograms decoded.
            ending.append(list(given) if given is not None and _layout(text) else None)
        undecoded = [g for g, d in enumerate(ending) if d is None]
        for g, d in zip(
            undecoded, decode_many(texts[e[undecoded] - 1].tolist(), layouts), strict=True
        ):
            ending[g] = d
        # The first sample in the window, where it is not the last.
        several = np.flatnonzero(e - h > 1)
        starting: list[list[float] | None] = [None] * len(plain)
        for g, d in zip(
            several.tolist(), decode_many(texts[h[several]].tolist(), layouts), strict=True
        ):
            starting[g] = d
        hists[name] = (starting, ending)
    increases = {name: _increases_many(*hists[name]) for name in HISTOGRAMS}
    for g, index in enumerate(indices):
        key, a, b = group_keys[index], hl[g], el[g]
        inner = Part(n=b - a, s=all_ts[b - 1] - all_ts[a])
        inner.c = dict(zip(AVAILABILITY, increases_c[g], strict=True))
        last_values: Values = {
            "c": {
                n: None if math.isnan(v) else v
                for n, v in zip(AVAILABILITY, lasts_c[g], strict=True)
            },
            "h": {},
        }
        for name in HISTOGRAMS:
            total = increases[name][g]
            if total is not None:
                inner.h[name] = total
            starting, ending = hists[name]
            last_values["h"][name] = ending[g] if ending[g] is not None else starting[g]
        if key not in entering:
            inner.st = None
        run = runs[index] if a == fl[index] else Run(all_ts[a - 1], _point(stall_values[a - 1]))
        last_values["wi"] = None if run is None else run.to_json()
        last_values["w"] = [all_ts[b - 1], list(_point(stall_values[b - 1])), None, False]
        entry = Part()
        carry = None if carries is None else carries.get(key[1])
        if carry is not None:
            entry = _entry(carry, firsts_c[g], last_values, inner, hists, g)
            entry.s = all_ts[a] - carry.last_ts
        out[key] = (
            inner,
            entry,
            last_values,
            [sigs[a]] * (b - a),
            [(t, 0.0) for t in all_ts[a:b]],
        )
    return out


def _entry(
    carry: Carry,
    firsts: list[float],
    last_values: Values,
    inner: Part,
    hists: dict[str, tuple[list[list[float] | None], list[list[float] | None]]],
    g: int,
) -> Part:
    """As `_stretch` with `before`: the step from the carry's last values into the
    stretch's first known ones, and the carry's values where the stretch knows none
    (`last_values` completed in place)."""
    entry = Part()
    previous = carry.values["c"]
    for name, value in zip(AVAILABILITY, firsts, strict=True):
        earlier = previous.get(name)
        if not math.isnan(value) and earlier is not None:
            entry.c[name] = step(earlier, value)
        if last_values["c"][name] is None:
            last_values["c"][name] = earlier
    for name in HISTOGRAMS:
        starting, ending = hists[name]
        decoded = [d for d in (starting[g], ending[g]) if d is not None]
        earlier_h = carry.values["h"].get(name)
        if decoded and earlier_h is not None and len(earlier_h) == len(decoded[0]):
            entry.h[name] = _steps(earlier_h, decoded[0])
        if not decoded:
            last_values["h"][name] = earlier_h
    return entry


def _padded(point: tuple[float | None, ...]) -> tuple[float | None, ...]:
    """A stall state's point with every STALL column (one kept before the sleep level was
    read has none: unknown)."""
    return (*point, *([None] * (len(STALL) - len(point))))


def _point(values: np.ndarray) -> tuple[float | None, ...]:
    return tuple(None if math.isnan(v) else v for v in values.tolist())


def _increases_many(
    starting: list[list[float] | None], ending: list[list[float] | None]
) -> list[list[float] | None]:
    """Per stretch, what `_stretch` sums for a histogram decoded at its first and last
    sample only (no reset between): the steps from the first to the last where both are
    known alike, zeros where one is, None where neither; in one numpy pass per length."""
    out: list[list[float] | None] = []
    pairs: dict[int, list[int]] = {}
    for g, (a, b) in enumerate(zip(starting, ending, strict=True)):
        known = [d for d in (a, b) if d is not None]
        out.append([0.0] * len(known[0]) if known else None)
        if a is not None and b is not None and len(a) == len(b):
            pairs.setdefault(len(a), []).append(g)
    for chosen in pairs.values():
        earlier = np.array([starting[g] for g in chosen], dtype=float)
        later = np.array([ending[g] for g in chosen], dtype=float)
        # As step(): the increase, or the later count where it went down (a reset).
        steps = (np.where(later >= earlier, later - earlier, later) + 0.0).tolist()
        for g, row in zip(chosen, steps, strict=True):
            out[g] = row
    return out


def decode_many(
    texts: list[Any], layouts: dict[int, tuple[float, ...]]
) -> list[list[float] | None]:
    """[_hist(text, layouts) for text in texts], the counts of each layout parsed and made
    cumulative in one numpy pass (the same numbers: a cumulative sum in order, as
    codec.decode_histogram's accumulate)."""
    out: list[list[float] | None] = [None] * len(texts)
    by_layout: dict[str, list[int]] = {}
    for i, text in enumerate(texts):
        if isinstance(text, str):
            by_layout.setdefault(text.split("|", 1)[0], []).append(i)
    for layout, chosen in by_layout.items():
        parts = [texts[i].split("|") for i in chosen]
        width = len(layouts[int(layout)])
        numbers = ",".join(p[2] for p in parts).split(",")
        if width == 0 or len(numbers) != width * len(chosen):
            for i in chosen:  # counts that do not fill the layout: one at a time
                out[i] = _hist(texts[i], layouts)
            continue
        counts = np.fromiter(map(float, numbers), dtype=float, count=len(numbers))
        cumulative = np.cumsum(counts.reshape(-1, width), axis=1)
        for i, row, p in zip(chosen, cumulative.tolist(), parts, strict=True):
            out[i] = [*row, float(p[1])]
    return out


def _stretch(
    rows: _Rows,
    first: int,
    end: int,
    layouts: dict[int, tuple[float, ...]],
    before: Carry | None,
    rule: StallRule = DEFAULT_RULE,
    state: tuple[Run | None, float] | None = None,
    known_last: Values | None = None,
) -> Stretch:
    """`state`: the stall state at the sample before `first` and the widest stuck gap (else
    `before`'s state, and the gap from these rows: `max_gap`). `known_last`: the values at
    the last row, decoded already (its sums row's `last`): its histograms are not decoded
    again."""
    sigs = rows.sigs[first:end]
    ts = rows.ts[first:end]
    inner = Part(n=end - first, s=ts[-1] - ts[0])
    entry = Part()
    previous = before.values["c"] if before is not None else {}
    last_values: Values = {"c": {}, "h": {}}
    for name in AVAILABILITY:
        known = [v for v in rows.values[name][first:end] if not math.isnan(v)]
        inner.c[name] = sum(step(a, b) for a, b in itertools.pairwise(known))
        last_known = previous.get(name)
        if before is not None and known and last_known is not None:
            entry.c[name] = step(last_known, known[0])
        last_values["c"][name] = known[-1] if known else last_known
    resets = [i - first for i in range(first + 1, end) if rows.went_down[i]]
    edges = sorted({0, end - first - 1, *resets, *(i - 1 for i in resets)})
    for name, column in zip(HISTOGRAMS, HIST_COLUMNS, strict=True):
        texts = rows.texts[column]
        given = None if known_last is None else known_last["h"].get(name)
        decoded = [
            d
            for d in (
                list(given)
                if given is not None and i == end - first - 1 and _layout(texts[first + i])
                else _hist(texts[first + i], layouts)
                for i in edges
            )
            if d is not None
        ]
        total = [0.0] * len(decoded[0]) if decoded else []
        for a, b in itertools.pairwise(decoded):
            # Pairs of the first sample's layout only: where it changed (a break, never read
            # across) around a reset, a pair of the new layout raised here before.
            if len(a) == len(b) == len(total):
                total = [x + y for x, y in zip(total, _steps(a, b), strict=True)]
        earlier = before.values["h"].get(name) if before is not None else None
        if decoded:
            inner.h[name] = total
            if earlier is not None and len(earlier) == len(decoded[0]):
                entry.h[name] = _steps(earlier, decoded[0])
        last_values["h"][name] = decoded[-1] if decoded else earlier
    if before is not None:
        entry.s = ts[0] - before.last_ts
    if state is None:
        run = before.run if before is not None else None
        state = (run, max_gap(ts, None if run is None else run.ts, rule))
    inner.st, last, credits = walk(rows, first, end, state[0], rule.after, state[1])
    # The stall state entering these rows and at the last (the next stretch's entering one).
    last_values["wi"] = None if state[0] is None else state[0].to_json()
    last_values["w"] = None if last is None else last.to_json()
    return inner, entry, last_values, sigs, list(zip(ts, credits, strict=True))


def bucket_rows(
    frame: pd.DataFrame,
    layouts: dict[int, tuple[float, ...]],
    carry: dict[int, Carry],
    bucket: float = BUCKET,
    rule: StallRule = DEFAULT_RULE,
) -> list[dict[str, Any]]:
    """The slo_sums rows for the samples in `frame` (whole buckets, ordered by target and
    time), each target continuing from its `carry` (updated in place)."""
    out: list[dict[str, Any]] = []
    if frame.empty:
        return out
    frame = frame.reset_index(drop=True)
    rows = _Rows.of(frame)
    targets = frame.target_id.astype(int).tolist()
    keys = [math.floor(t / bucket) * bucket for t in rows.ts]
    first = 0
    for end in range(1, len(targets) + 1):
        if end < len(targets) and (targets[end], keys[end]) == (targets[first], keys[first]):
            continue
        target_id, start = targets[first], keys[first]
        before = carry.get(target_id)
        inner, entry, last_values, sigs, _ = _stretch(rows, first, end, layouts, before, rule)
        inner_break = len(set(sigs)) > 1
        entry_break = before is not None and before.sig != sigs[0]
        base = before.sums if before is not None else Part()
        if base.st is None:  # summed before stalls were: their running sum starts here
            base = replace(base, st=0.0)
        sums = base.plus(entry).plus(inner)
        # A histogram whose layout changed starts its running sum again (never read across:
        # the change is a break).
        for name in list(sums.h):
            if name in inner.h and len(sums.h[name]) != len(inner.h[name]):
                sums.h[name] = list(inner.h[name])
        breaks = (before.breaks if before is not None else 0) + int(inner_break) + int(entry_break)
        out.append(
            {
                "target_id": target_id,
                "bucket": float(start),
                "first_ts": rows.ts[first],
                "last_ts": rows.ts[end - 1],
                "sig": sigs[-1],
                "inner_break": inner_break,
                "entry_break": entry_break,
                "breaks": breaks,
                "sums": sums.to_json(),
                "inner": inner.to_json(),
                "last": json.dumps(last_values),
            }
        )
        carry[target_id] = Carry(
            rows.ts[end - 1], sigs[-1], last_values, sums, breaks, Run.from_json(last_values["w"])
        )
        first = end
    return out


def progress(session: Session) -> SloSumProgressRow | None:
    return session.get(SloSumProgressRow, PROGRESS)


def advance(
    session: Session,
    now: float,
    reach_back: float,
    layouts: dict[int, tuple[float, ...]],
    most: int = 288,
    budget: int = BUDGET,
    rule: StallRule = DEFAULT_RULE,
) -> int:
    """Sum the whole buckets not written yet, from `reach_back` seconds before `now` on a
    first run. Returns the buckets written. The caller commits.

    One call writes at most `most` buckets (a day) and at most `budget` target-buckets (2
    buckets at 1,000 targets, 12 at 200), so a round that catches up a long history costs
    about what a steady round does: a first run over days of history at fleet size catches
    up over many rounds (measure reads the samples until it has)."""
    end = math.floor((now - SETTLE) / BUCKET) * BUCKET
    row = progress(session)
    if row is None:
        first = math.floor((now - reach_back) / BUCKET) * BUCKET
        row = SloSumProgressRow(name=PROGRESS, since=first, until=first)
        session.add(row)
    # Rows older than any window read are dropped: a reader never uses a bucket before
    # `since` (evaluate.measure reads the samples there), so no kept row needs them.
    oldest = math.floor((now - reach_back) / BUCKET) * BUCKET
    if oldest > row.since:
        session.execute(delete(SloSumRow).where(SloSumRow.bucket < oldest - BUCKET))
        row.since = oldest
    began = row.until
    ids = list(session.scalars(select(TargetRow.id)))
    most = max(1, min(most, budget // max(1, len(ids))))
    # Buckets with no sample (history before the fleet existed, a 30-day SLO on a new
    # store) are passed over at once, not a budget's share at a time.
    start = _first_with_samples(session, ids, began, end)
    stop = min(end, start + most * BUCKET)
    if stop <= start:
        if end > began:
            row.until = max(began, min(start, end))
            session.flush()
        return max(0, int((row.until - began) // BUCKET))
    frame = _read(session, ids, start, stop)
    carry = _carry(session, sorted(set(frame.target_id.astype(int))), start) if len(frame) else {}
    rows = bucket_rows(frame, layouts, carry, rule=rule)
    if rows:
        session.execute(SUMS.insert(), rows)
    row.until = stop
    session.flush()
    return int((stop - began) // BUCKET)


def _first_with_samples(session: Session, ids: list[int], start: float, end: float) -> float:
    """The first bucket at or after `start` (a bucket bound) where a target of `ids` has a
    sample, or `end` when none has before it: growing spans until one holds a sample, then
    halving it, each probe one LIMIT 1 query on the (target_id, ts) key."""
    if start >= end or not ids or _any(session, ids, start, start + BUCKET):
        return start
    low, width = start + BUCKET, BUCKET  # [start, low) holds no sample
    while True:
        if low >= end:
            return end
        high = min(end, low + width)
        if _any(session, ids, low, high):
            break
        low, width = high, width * 2
    while high - low > BUCKET:  # a sample in [low, high), none before `low`
        middle = low + math.floor((high - low) / BUCKET / 2) * BUCKET
        if _any(session, ids, low, middle):
            high = middle
        else:
            low = middle
    return low


def _any(session: Session, ids: list[int], start: float, end: float) -> bool:
    query = (
        select(SAMPLES.c.ts)
        .where(SAMPLES.c.target_id.in_(ids), SAMPLES.c.ts >= start, SAMPLES.c.ts < end)
        .limit(1)
    )
    return session.execute(query).first() is not None


def _read(session: Session, ids: list[int], start: float, end: float) -> pd.DataFrame:
    if not ids:
        return pd.DataFrame(columns=["target_id", "ts", *READ])
    query = (
        select(SAMPLES.c.target_id, SAMPLES.c.ts, *(SAMPLES.c[c] for c in READ))
        .where(among(session, SAMPLES.c.target_id, ids), SAMPLES.c.ts >= start, SAMPLES.c.ts < end)
        .order_by(SAMPLES.c.target_id, SAMPLES.c.ts)
    )
    return queries.read_bulk(session, query)


def raw(session: Session, ids: list[int], start: float, end: float, closed: bool) -> pd.DataFrame:
    """The samples of `ids` in [start, end) ([start, end] when closed), as the sums read them."""

    high = SAMPLES.c.ts <= end if closed else SAMPLES.c.ts < end
    query = (
        select(SAMPLES.c.target_id, SAMPLES.c.ts, *(SAMPLES.c[c] for c in READ))
        .where(among(session, SAMPLES.c.target_id, ids), SAMPLES.c.ts >= start, high)
        .order_by(SAMPLES.c.target_id, SAMPLES.c.ts)
    )
    return queries.read_bulk(session, query)


def raw_spans(
    session: Session,
    ids: Sequence[int],
    spans: Sequence[tuple[float, float]],
    texts_from: Sequence[float] | None = None,
) -> pd.DataFrame:
    """The samples of `ids` in each [start, end) of `spans`, as `raw` reads them, in one
    statement (a UNION ALL of one range of the key per span), ordered by target and time:
    a round's windows read their partial start buckets together. `texts_from`: per span,
    the time before which the histograms are not needed (None there): a window's samples
    before its start are read for stall detection's walk only, which reads no histogram."""

    columns = ("target_id", "ts", *READ)
    froms = list(texts_from) if texts_from is not None else [None] * len(spans)

    def read(name: str, since: float | None) -> Any:
        if since is None or name not in HIST_COLUMNS:
            return SAMPLES.c[name]
        return case((SAMPLES.c.ts >= since, SAMPLES.c[name]), else_=None).label(name)

    selects = [
        select(*(read(c, since) for c in columns)).where(
            among(session, SAMPLES.c.target_id, ids), SAMPLES.c.ts >= start, SAMPLES.c.ts < end
        )
        for (start, end), since in zip(spans, froms, strict=True)
        if end > start
    ]
    if not ids or not selects:
        return pd.DataFrame(columns=list(columns))
    rows = (union_all(*selects) if len(selects) > 1 else selects[0]).subquery("spans")
    return queries.read_bulk(session, select(rows).order_by(rows.c.target_id, rows.c.ts))


def rows_in(
    session: Session, ids: Sequence[int], buckets: Sequence[float], columns: Sequence[str]
) -> dict[float, dict[int, dict[str, Any]]]:
    """The rows of `ids` at each of `buckets` (those that exist), by bucket and target."""
    if not ids or not buckets:
        return {}
    query = select(SUMS.c.target_id, SUMS.c.bucket, *(SUMS.c[c] for c in columns)).where(
        SUMS.c.target_id.in_(list(ids)), SUMS.c.bucket.in_([float(b) for b in buckets])
    )
    out: dict[float, dict[int, dict[str, Any]]] = {}
    for row in session.execute(query).mappings():
        out.setdefault(float(row["bucket"]), {})[int(row["target_id"])] = dict(row)
    return out


def _carry(session: Session, ids: list[int], before: float) -> dict[int, Carry]:
    """Each target's latest row before `before`."""
    rows = latest(session, ids, before, ("last_ts", "sig", "last", "sums", "breaks"))
    return {t: carried(r, Part.from_json(r["sums"]), r["breaks"]) for t, r in rows.items()}


def carried(row: dict[str, Any], sums: Part, breaks: int) -> Carry:
    """A Carry from a sums row's last_ts, sig and last (with `sums` and `breaks`)."""
    last = json.loads(row["last"])
    return Carry(row["last_ts"], row["sig"], last, sums, breaks, Run.from_json(last.get("w")))


def latest(
    session: Session, ids: Sequence[int], before: float, columns: Sequence[str]
) -> dict[int, dict[str, Any]]:
    """Each target's latest slo_sums row with bucket < `before` (those that have one): the
    last hour first (one range of the key each), then further back for the rest."""
    found: dict[int, dict[str, Any]] = {}
    for low in (before - 12 * BUCKET, None):
        rest = [t for t in ids if t not in found]
        if not rest:
            break
        where = [SUMS.c.target_id.in_(rest), SUMS.c.bucket < before]
        if low is not None:
            where.append(SUMS.c.bucket >= low)
        found |= _ends(session, func.max, where, columns)
    return found


def rows_at(
    session: Session, ids: Sequence[int], bucket: float, columns: Sequence[str]
) -> dict[int, dict[str, Any]]:
    if not ids:
        return {}
    query = select(SUMS.c.target_id, SUMS.c.bucket, *(SUMS.c[c] for c in columns)).where(
        SUMS.c.target_id.in_(list(ids)), SUMS.c.bucket == bucket
    )
    return {int(r["target_id"]): dict(r) for r in session.execute(query).mappings()}


def first_in(
    session: Session, ids: Sequence[int], low: float, high: float, columns: Sequence[str]
) -> dict[int, dict[str, Any]]:
    """Each target's first row with low <= bucket < high: at `low` itself first."""
    found = rows_at(session, ids, low, columns)
    rest = [t for t in ids if t not in found]
    if rest:
        where = [SUMS.c.target_id.in_(rest), SUMS.c.bucket >= low, SUMS.c.bucket < high]
        found |= _ends(session, func.min, where, columns)
    return found


def _ends(
    session: Session, pick: Any, where: list[Any], columns: Sequence[str]
) -> dict[int, dict[str, Any]]:
    """Each target's row at the bucket `pick` (func.max: its newest; func.min: its oldest)
    chooses among the rows `where` selects."""
    chosen = (
        select(SUMS.c.target_id, pick(SUMS.c.bucket).label("b"))
        .where(*where)
        .group_by(SUMS.c.target_id)
        .subquery()
    )
    query = select(SUMS.c.target_id, SUMS.c.bucket, *(SUMS.c[c] for c in columns)).join(
        chosen, and_(SUMS.c.target_id == chosen.c.target_id, SUMS.c.bucket == chosen.c.b)
    )
    return {int(r["target_id"]): dict(r) for r in session.execute(query).mappings()}


def increments(
    session: Session, ids: Sequence[int], low: float, high: float
) -> dict[int, list[tuple[float, str, Part | None]]]:
    """Each target's increases per bucket with low <= bucket < high, oldest first, as (the
    bucket's start, its `sig`, the increase): from the last sample of the
    target's row before (its running sums' difference, the step into the bucket included), or,
    for a first row with none before it kept, the bucket's own increases (`inner`). None where
    the layout or the counters known changed (a break: not a count)."""
    if not ids:
        return {}
    columns = ("sig", "breaks", "inner_break", "sums", "inner")
    before = latest(session, ids, low, columns)
    query = (
        select(SUMS.c.target_id, SUMS.c.bucket, *(SUMS.c[c] for c in columns))
        .where(SUMS.c.target_id.in_(list(ids)), SUMS.c.bucket >= low, SUMS.c.bucket < high)
        .order_by(SUMS.c.target_id, SUMS.c.bucket)
    )
    out: dict[int, list[tuple[float, str, Part | None]]] = {}
    previous: dict[int, dict[str, Any]] = dict(before)
    for row in session.execute(query).mappings():
        target_id = int(row["target_id"])
        prior = previous.get(target_id)
        increase: Part | None
        if prior is None:
            increase = None if row["inner_break"] else Part.from_json(row["inner"])
        elif prior["breaks"] != row["breaks"]:
            increase = None
        else:
            increase = Part.from_json(row["sums"]).plus(Part.from_json(prior["sums"]), -1.0)
        out.setdefault(target_id, []).append((float(row["bucket"]), row["sig"], increase))
        previous[target_id] = dict(row)
    return out
