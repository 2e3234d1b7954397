"""The app's read path for the on-call cockpit's judgements: the signals the likely cause is
classified from (kneepoint/causes.py) and the headroom forecasts (kneepoint/forecast.py),
cached like app/data.py's queries: on the store's data version, shared by every session, and
warmed for each new version (app/warm.py)."""

from __future__ import annotations

from alerts.rules import effective_rules
from alerts.slo import burn_rules
from app import changes, data
from kneepoint import causes, forecast
from kneepoint.config import ConfigError
from kneepoint.store import queries


def signals(now: float) -> causes.Signals:
    """Every replica's signals over causes.WINDOW and the changes in the hour before, as of
    `now` (the page's, data.now()): gathered once per data version."""
    path = data.config_file()
    return _signals(path, now, data.known(path).key)


@data.versioned("key", times=("now",))
def _signals(path: str, now: float, version: data.Key) -> causes.Signals:
    config, sessions = data._open(path)
    try:
        # The hour's changes as the 1-hour charts' markers read them (the same cache entry,
        # app/changes.py), not read from the timeline a second time each version.
        hour = tuple(changes._events(path, now - causes.LOOKBACK, now, version))
    except Exception:  # the timeline is a witness: gather reads it again, and logs its error
        hour = None
    with sessions() as session:
        return causes.gather(session, config, now, events=hour)


def cause(
    now: float, replica: str | None = None, began: causes.Onset | None = None
) -> causes.Cause:
    """The likely cause now, for one replica or (None) the fleet, of a trouble that began at
    `began` (causes.onset; None: now): only the changes in the hour before it count."""
    path = data.config_file()
    key = data.known(path).key
    (found,) = causes.causes_of(
        signals(now),
        [causes.Trouble(replica, began)],
        lambda since, until: _changes(path, since, until, key),
    )
    return found


def alert_causes(now: float) -> dict[str, causes.Cause]:
    """Every pending or firing alert's likely cause as of `now`, by its fingerprint: one
    cached call per data version, not one per alert or onset (an SLO burn's onset moves
    with the tick), so the warmer makes it again for each new version, and the Alerts page
    reads one small dict instead of the fleet's signals once per alert."""
    path = data.config_file()
    return _alert_causes(path, now, data.known(path).key)


@data.versioned("key", times=("now",))
def _alert_causes(path: str, now: float, version: data.Key) -> dict[str, causes.Cause]:
    config, sessions = data._open(path)
    try:
        rules = effective_rules(config)
    except ConfigError:  # a bad config rule: the Alerts page says which; its metrics unknown
        rules = []
    metrics = {rule.name: rule.metric for rule in rules + burn_rules(config.slos)}
    with sessions() as session:
        frame = queries.alert_states(session)
    troubles = {
        str(row["fingerprint"]): causes.Trouble(
            str(row["replica"] or "") or None,
            causes.onset(
                metrics.get(str(row["rule"]), ""), now, data._number(row["pending_since"])
            ),
        )
        for row in frame.to_dict("records")
    }
    return _causes(path, now, version, troubles)


def slo_causes(now: float) -> dict[str, causes.Cause]:
    """Each burning SLO's likely cause as of `now`, by the SLO's name (the burn began at the
    shortest long window that tripped, of the reports of `now`'s minute: data.slo_reports):
    one cached call per data version, warmed for each new one (the onset moves with it)."""
    path = data.config_file()
    return _slo_causes(path, now, data.known(path).key)


@data.versioned("key", times=("now",))
def _slo_causes(path: str, now: float, version: data.Key) -> dict[str, causes.Cause]:
    burning = {
        r.slo.name: causes.Trouble(None, causes.burn_onset(now, [w.long for w in r.burning]))
        for r in data._slo_reports(path, data.slo_minute(now))
        if r.burning
    }
    return _causes(path, now, version, burning)


def _causes(
    path: str, now: float, version: data.Key, troubles: dict[str, causes.Trouble]
) -> dict[str, causes.Cause]:
    """Each trouble's cause by its key, from the version's signals and the changes before
    each onset (cached: the Alerts and SLOs pages' burns share their reads); none asked,
    nothing read."""
    if not troubles:
        return {}
    found = causes.causes_of(
        _signals(path, now, version),
        list(troubles.values()),
        lambda since, until: _changes(path, since, until, settled(version, until)),
    )
    return dict(zip(troubles, found, strict=True))


SETTLE = 300.0  # a span ending this long before the tick gets no row from a new round


def settled(version: data.Key, until: float) -> data.Key:
    """The version the changes of a span ending at `until` are cached under: the whole data
    version while the span reaches the rounds being written; once it ends SETTLE before the
    tick, what can still change a past span's events only: the mutations (an annotation
    posted for a past time, an alert's history), the targets and the rollups' progress (a
    rollup replaces the rows a span reads; it moves every 5 minutes), not the newest round
    nor the tick. So an SLO burn's onset an hour back, or an alert pending for a while, has
    its hour of changes read once per rollup, not once per 15 s round by the warmer."""
    samples, changes, tick = version
    if until > tick - SETTLE:
        return version
    return (tuple(samples[1:]), changes)


# Keyed on the data version (a change written late, or an annotation, shows at once); the
# span is around a fixed onset, not one moved with the tick.
@data.versioned("key", pin=False)
def _changes(path: str, since: float, until: float, version: data.Key) -> tuple[causes.Event, ...]:
    config, sessions = data._open(path)
    with sessions() as session:
        return causes.changes_between(session, config, since, until)


def forecasts(now: float) -> list[forecast.Forecast]:
    """Each replica's headroom forecast from the history before today, as of the hour of
    `now`, and the stored runs (the knees it compares with)."""
    path = data.config_file()
    return _forecasts(path, now // 3600 * 3600, data.known(path).changes)


# Keyed on the hour, not on each round: it reads whole days before today, which a round
# does not change; the stored runs it assesses are the version's `changes`.
@data.versioned("changes", times=("now",), step=3600.0, spinner="Fitting the daily peaks…")
def _forecasts(path: str, now: float, version: data.Key) -> list[forecast.Forecast]:
    config, sessions = data._open(path)
    with sessions() as session:
        return forecast.forecasts(session, config, now)
