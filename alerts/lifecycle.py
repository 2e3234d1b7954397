"""An alert's lifecycle, as a pure function of its rule, the value now and its last state:
inactive → pending (breaching, waiting out `for:`) → firing → resolved. A firing alert with a
`resolve_threshold` resolves only once the value is back past it (hysteresis), so a value
hovering at the threshold does not flap.

No value (no data: the target stopped answering, scraping stopped, nothing in the window)
is never read as "all is well". The rule's `no_data` decides:

- `keep` (the default): the alert holds its state. A firing alert stays firing, and the
  evaluation where its data went missing is reported (a firing → firing transition with no
  value, which the history and the message show as "no data"); a pending alert keeps its
  `pending_since`, so a gap does not restart `for:` (but it fires only on a breaching value).
- `resolve`: no data counts as recovered; the resolution carries no value ("no data").
- `alert`: no data counts as a breach, and fires after `for:` like one.

Every transition carries the value seen at that evaluation (None: no data), never an older
one.

A rule whose metric the replica's engine does not expose (kneepoint.samples.QUANTITIES: an
`auto` target now serving SGLang has no preemption counter) does not apply there: it never
pends or fires. An engine change never ends an alert by itself, though: an alert pending or
firing when its metric stops being exposed, on a replica whose engine was first seen less
than the rule's `for` ago (at least ENGINE_SETTLE), is evaluated as having no value, by its
`no_data` (keep: held; resolve: resolved, "no data"; alert: a breach). A scrape of the
wrong port or an engine swapped back within that time leaves a held alert as it was. Once
the new engine has been seen that long, the alert ends, resolved, with the reason."""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Callable
from dataclasses import dataclass, replace

from kneepoint.config import Rule

PENDING, FIRING, RESOLVED, INACTIVE = "pending", "firing", "resolved", "inactive"
# The least time a new engine must have been seen before an alert whose metric it does not
# expose ends for that reason, for rules with a shorter `for` (`for: 0`): one scrape of the
# wrong port, or an engine swapped and swapped back, must not end an alert.
ENGINE_SETTLE = 60.0
COMPARE: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}


@dataclass(frozen=True)
class Alert:
    fingerprint: str
    rule: str
    replica: str  # "" for the fleet
    state: str
    value: float | None
    threshold: float
    pending_since: float | None = None
    fired_at: float | None = None
    resolved_at: float | None = None


@dataclass(frozen=True)
class Transition:
    alert: Alert  # its `value` is the one seen at this evaluation (None: no data)
    before: str | None  # None: the alert did not exist
    after: str
    # Why there is no value, where it is not mere missing data: the replica's engine does
    # not expose the rule's quantity (the alert ended; kneepoint.samples.QUANTITIES).
    note: str | None = None

    @property
    def no_data(self) -> bool:
        return self.alert.value is None


def fingerprint(rule: Rule, replica: str) -> str:
    """Stable identity of one rule on one replica (or the fleet), as Alertmanager keys it:
    the sorted labels, hashed."""
    labels = {"alertname": rule.name, "replica": replica or "fleet", **rule.labels}
    text = "\x1f".join(f"{k}={labels[k]}" for k in sorted(labels))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def breaching(rule: Rule, value: float | None, firing: bool) -> bool:
    """Is the value on the bad side? Once firing, it must cross the resolve threshold (when
    one is set) to count as recovered. No value (no data) is a breach only for a rule with
    `no_data: alert` (`keep` never gets here: step() holds the state instead)."""
    if value is None:
        return rule.no_data == "alert"
    compare = COMPARE[rule.op]
    if firing and rule.resolve_threshold is not None:
        return compare(value, rule.resolve_threshold)
    return compare(value, rule.threshold)


def step(
    rule: Rule, replica: str, value: float | None, last: Alert | None, now: float
) -> Alert | None:
    """The alert's state after this evaluation (None: inactive and nothing to keep)."""
    if value is None and rule.no_data == "keep":
        # Hold whatever state there was: a firing alert stays firing, a pending one keeps
        # its pending_since (it fires once a breaching value comes back after `for:`).
        return None if last is None else replace(last, value=None)
    firing = last is not None and last.state == FIRING
    bad = breaching(rule, value, firing)
    if firing:
        assert last is not None
        if bad:
            return replace(last, value=value)
        return replace(last, state=RESOLVED, value=value, resolved_at=now)
    if not bad:
        return last if last is not None and last.state == RESOLVED else None
    if last is not None and last.state == PENDING:
        since = last.pending_since if last.pending_since is not None else now
        if now - since >= rule.for_:
            return replace(last, state=FIRING, value=value, fired_at=now)
        return replace(last, value=value)
    alert = Alert(
        fingerprint(rule, replica), rule.name, replica, PENDING, value, rule.threshold, now
    )
    return replace(alert, state=FIRING, fired_at=now) if rule.for_ <= 0 else alert


def settle_time(rule: Rule) -> float:
    """How long a new engine must have been seen before an alert of `rule` whose metric it
    does not expose ends for that reason: the rule's `for`, at least ENGINE_SETTLE."""
    return max(rule.for_, ENGINE_SETTLE)


def _settling(rule: Rule, last: Alert | None, since: float | None, now: float) -> bool:
    """Is `last` an alert (pending or firing) on a replica whose engine is new: first seen
    less than settle_time(rule) ago? Not for a replica without an alert: a rule whose metric
    the engine does not expose never starts one there."""
    return (
        last is not None
        and last.state in (PENDING, FIRING)
        and since is not None
        and now - since < settle_time(rule)
    )


def evaluate(
    rules: list[Rule],
    values: dict[str, dict[str, float | None]],
    alerts: dict[str, Alert],
    now: float,
    not_exposed: dict[str, dict[str, str]] | None = None,
    engine_since: dict[str, float] | None = None,
) -> tuple[dict[str, Alert], list[Transition]]:
    """Every rule on every replica (or the fleet, by scope): the new states and what changed.

    A rule whose metric the replica's engine does not expose (`not_exposed`: replica ->
    metric -> reason) does not apply there: it never pends or fires, whatever its `no_data`.
    An alert it had (the target's engine changed) is evaluated with no value, by the rule's
    `no_data`, while the replica's engine was first seen (`engine_since`: replica -> epoch
    seconds; absent: long ago) less than settle_time(rule) before `now`; after that (or at
    once, where it was not pending or firing or the engine is not new) it ends, resolved,
    with the reason."""
    states: dict[str, Alert] = {}
    transitions: list[Transition] = []
    for rule in rules:
        scopes = [""] if rule.scope == "fleet" else [name for name in values if name]
        for replica in scopes:
            key = fingerprint(rule, replica)
            last = alerts.get(key)
            reason = (not_exposed or {}).get(replica, {}).get(rule.metric)
            value: float | None = None
            if reason is not None and _settling(rule, last, (engine_since or {}).get(replica), now):
                reason = None  # no value, by `no_data`, until the new engine has settled
            else:
                value = values.get(replica, {}).get(rule.metric)
            if reason is not None:
                if last is not None and last.state != RESOLVED:
                    ended = replace(last, state=RESOLVED, value=None, resolved_at=now)
                    states[key] = ended
                    transitions.append(Transition(ended, last.state, RESOLVED, note=reason))
                elif last is not None:
                    states[key] = last
                continue
            new = step(rule, replica, value, last, now)
            before = None if last is None else last.state
            after = INACTIVE if new is None else new.state
            if new is not None:
                states[key] = new
            changed = after != (before or INACTIVE) and not (before is None and after == RESOLVED)
            # A firing alert held through missing data says so, once, when the data goes.
            went_missing = (
                before == after == FIRING
                and value is None
                and last is not None
                and last.value is not None
            )
            if changed or went_missing:
                # The value seen now, also for an alert that has just become inactive.
                seen = new or (last and replace(last, value=value))
                assert seen is not None  # a change has a state before or after
                transitions.append(Transition(seen, before, after))
    return states, transitions
