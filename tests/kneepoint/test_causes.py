"""Why the budget burns: each cause class fires on a scenario built for it and stays quiet on
one built not to, and "unknown" says what it looked at. First on signals built by hand
(classify is pure), then on a store holding one replica per scenario (gather reads it)."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from alerts.channels.base import Notice
from alerts.lifecycle import FIRING, PENDING, Alert, Transition
from alerts.messages import enqueue
from alerts.rules import BUILT_IN
from collectors.dcgm import parse_dcgm
from collectors.engines.vllm import parse_vllm
from kneepoint import causes
from kneepoint.causes import (
    CAPACITY,
    HARDWARE,
    LOAD,
    LOOKBACK,
    SOFTWARE,
    UNKNOWN,
    UPSTREAM,
    WINDOW,
    Onset,
    ReplicaSignals,
    Signals,
    classify,
)
from kneepoint.config import Config, load_config
from kneepoint.knee.runs import Point, Run
from kneepoint.samples import SATURATION
from kneepoint.store.db import connect_store
from kneepoint.store.models import NotificationRow
from kneepoint.store.runs import save_run
from kneepoint.store.writer import ensure_targets, record_gpus, record_replica
from kneepoint.timeline import Event
from tests.conftest import DCGM_T4, VLLM_032, migrated, read

AT = 1_780_000_000.0
KNEE = 32
QUIET = ReplicaSignals(
    "a",
    concurrency=KNEE / 4,
    knee=KNEE,
    kv_occupancy=SATURATION / 2,
    waiting_capacity=0.0,
    preemptions_per_second=0.0,
    stalled=False,
    running=KNEE / 4,
    waiting=0.0,
)


def one(replica: ReplicaSignals, events: tuple[Event, ...] = ()) -> causes.Cause:
    return classify(Signals(AT, (replica,), events), "a")


def test_quiet_replica_is_unknown_and_says_what_was_looked_at() -> None:
    cause = one(QUIET)
    assert cause.kind == UNKNOWN and cause.secondary == ()
    assert f"{QUIET.concurrency:.0f}" in cause.evidence and str(KNEE) in cause.evidence
    assert "XID" in cause.evidence and cause.line().startswith("unknown: ")


def test_load_at_or_past_the_knee() -> None:
    for concurrency in (KNEE, KNEE * 1.5):
        cause = one(replace(QUIET, concurrency=concurrency))
        assert cause.kind == LOAD, cause
        assert f"{concurrency:.0f}" in cause.evidence and str(KNEE) in cause.evidence
    below = one(replace(QUIET, concurrency=KNEE - 1))
    assert below.kind == UNKNOWN
    no_knee = one(replace(QUIET, concurrency=KNEE * 4, knee=None))
    assert no_knee.kind == UNKNOWN  # no knee: load cannot be judged


@pytest.mark.parametrize(
    ("change", "shown"),
    [
        ({"kv_occupancy": (1 + SATURATION) / 2}, "KV cache at"),
        ({"waiting_capacity": 3.0}, "3 waiting for KV capacity"),
        ({"preemptions_per_second": causes.PREEMPTIONS_PER_SECOND * 4}, "preemptions/s"),
    ],
)
def test_capacity_from_kv_waiting_or_preemptions(change: dict, shown: str) -> None:
    cause = one(replace(QUIET, **change))
    assert cause.kind == CAPACITY and shown in cause.evidence


def test_capacity_not_at_its_thresholds() -> None:
    edge = replace(
        QUIET,
        kv_occupancy=SATURATION,
        waiting_capacity=0.0,
        preemptions_per_second=causes.PREEMPTIONS_PER_SECOND,
    )
    assert one(edge).kind == UNKNOWN


def test_hardware_from_an_xid_now_or_a_gpu_event_in_the_hour_before() -> None:
    xid = one(replace(QUIET, xid_gpus=("GPU n1/0: XID 79",)))
    assert xid.kind == HARDWARE and "XID 79" in xid.evidence
    throttle = Event(AT - 600, "a", "gpu_throttle", "GPU n1/0 clocks held by HW_SLOWDOWN")
    cause = one(QUIET, (throttle,))
    assert cause.kind == HARDWARE and "HW_SLOWDOWN" in cause.evidence and "10 min" in cause.evidence
    old = replace(throttle, at=AT - LOOKBACK - 60)
    other = replace(throttle, replica="b")
    assert one(QUIET, (old,)).kind == UNKNOWN  # over an hour before
    assert one(QUIET, (other,)).kind == UNKNOWN  # another replica's GPU


def test_software_from_a_restart_or_config_change_just_before() -> None:
    restart = Event(AT - 300, "a", "restart", "process start time moved")
    config = Event(AT - 120, "a", "config_change", "cache dtype auto → fp8")
    cause = one(QUIET, (restart, config))
    assert cause.kind == SOFTWARE
    assert cause.evidence.index("fp8") < cause.evidence.index("restart")  # latest first
    deploy = Event(AT - 60, None, "annotation", "prompt v42")  # a fleet-wide marker
    assert one(QUIET, (deploy,)).kind == SOFTWARE
    unrelated = (
        Event(AT - 60, "a", "alert_firing", "kv-cache-saturated"),
        Event(AT - 60, "a", "hit_rate_drop", "hit rate 80 % → 40 %"),
        replace(restart, at=AT - LOOKBACK - 1),  # too long before
        replace(restart, at=AT + 60),  # after
        replace(restart, replica="b"),  # another replica
    )
    assert one(QUIET, unrelated).kind == UNKNOWN


DAY = 86400.0


def test_a_three_day_burn_is_not_blamed_on_a_restart_minutes_ago() -> None:
    began = causes.onset("slo_burn:avail:3d", AT)  # the 3d/6h pair tripped
    assert began == Onset(AT - 3 * DAY, "the burn began")
    restart = Event(AT - 300, "a", "restart", "process start time moved")
    throttle = Event(AT - 120, "a", "gpu_throttle", "GPU n1/0 clocks held by HW_SLOWDOWN")
    xid_now = replace(QUIET, xid_gpus=("GPU n1/0: XID 79",))
    cause = classify(Signals(AT, (xid_now,), (restart, throttle)), "a", began)
    assert cause.kind == UNKNOWN, cause
    # Said plainly, with the moment the burn began (AT is 20:26:40 UTC).
    assert "no change, XID, stall or restart in the hour before the burn began at 20:26 UTC" in (
        cause.evidence
    )
    # The same restart within the hour before the burn's window began is the cause.
    before = replace(restart, at=began.at - 600)
    blamed = classify(Signals(AT, (QUIET,), (restart, before)), "a", began)
    assert blamed.kind == SOFTWARE and "10 min before the burn began" in blamed.evidence
    assert blamed.evidence.count("restart") == 1  # the one minutes ago is not listed


def test_a_restart_20_minutes_before_the_alert_went_pending_is_the_cause() -> None:
    pending_since = AT - 900
    began = causes.onset("kv_cache_occupancy", AT, pending_since)
    assert began == Onset(pending_since, "the alert went pending")
    restart = Event(pending_since - 1200, "a", "restart", "process start time moved")
    cause = classify(Signals(AT, (QUIET,), (restart,)), "a", began)
    assert cause.kind == SOFTWARE
    assert "20 min before the alert went pending" in cause.evidence
    # After it went pending (even within the hour before now) it explains nothing.
    later = replace(restart, at=pending_since + 60)
    assert classify(Signals(AT, (QUIET,), (later,)), "a", began).kind == UNKNOWN
    # Over an hour before it went pending: too long before.
    old = replace(restart, at=pending_since - LOOKBACK - 60)
    assert classify(Signals(AT, (QUIET,), (old,)), "a", began).kind == UNKNOWN


def test_hardware_must_precede_the_onset_too() -> None:
    began = Onset(AT - 2 * WINDOW, "the alert went pending")
    xid_now = replace(QUIET, xid_gpus=("GPU n1/0: XID 79",))
    assert classify(Signals(AT, (xid_now,)), "a", began).kind == UNKNOWN  # seen only now
    fresh = Onset(AT - WINDOW / 2, "the alert went pending")
    assert classify(Signals(AT, (xid_now,)), "a", fresh).kind == HARDWARE
    xid = Event(began.at - 300, "a", "gpu_xid", "GPU n1/0: XID 79")
    cause = classify(Signals(AT, (QUIET,), (xid,)), "a", began)
    assert cause.kind == HARDWARE and "5 min before the alert went pending" in cause.evidence
    after = replace(xid, at=began.at + 300)
    assert classify(Signals(AT, (QUIET,), (after,)), "a", began).kind == UNKNOWN


def test_onset_of_an_alert_without_a_pending_time_or_window_is_now() -> None:
    assert causes.onset("kv_cache_occupancy", AT) == Onset(AT)
    assert causes.onset("slo_burn:avail:1h", AT, AT - 60) == Onset(AT - 3600, "the burn began")
    assert causes.burn_onset(AT, [3 * DAY, 3600.0]) == Onset(AT - 3600, "the burn began")
    assert "in the hour before now" in classify(Signals(AT, (QUIET,)), "a").evidence


def test_upstream_from_a_stalled_engine() -> None:
    stalled = replace(QUIET, stalled=True, stalled_since=AT - 180, running=4.0, waiting=2.0)
    cause = one(stalled)
    assert cause.kind == UPSTREAM
    assert "4 running" in cause.evidence and "2 waiting" in cause.evidence
    assert one(replace(QUIET, stalled=None)).kind == UNKNOWN  # no data is not a stall


def test_the_root_comes_first_and_the_rest_are_secondary() -> None:
    everything = replace(
        QUIET,
        stalled=True,
        concurrency=KNEE * 2,
        kv_occupancy=1.0,
        xid_gpus=("GPU n1/0: XID 79",),
    )
    change = Event(AT - 60, "a", "restart", "restarted")
    cause = one(everything, (change,))
    assert cause.kind == UPSTREAM
    assert cause.secondary == (HARDWARE, SOFTWARE, LOAD, CAPACITY)
    assert set(cause.details) == {UPSTREAM, HARDWARE, SOFTWARE, LOAD, CAPACITY}
    both = one(replace(QUIET, concurrency=KNEE * 2, kv_occupancy=1.0))
    assert (both.kind, both.secondary) == (LOAD, (CAPACITY,))


def test_the_fleet_looks_at_every_replica() -> None:
    busy = replace(QUIET, replica="b", concurrency=KNEE * 2)
    signals = Signals(AT, (QUIET, busy))
    assert classify(signals, "a").kind == UNKNOWN
    fleet = classify(signals)
    assert fleet.kind == LOAD and "b at" in fleet.evidence


# A store with one replica per scenario: gather reads what the pages read.
SCENARIOS = {
    # name: (running, waiting, waiting for capacity, KV occupancy, counters move); "broken"
    # holds the GPU that reports XID.
    "quiet": (4.0, 0.0, 0.0, 0.3, True),
    "busy": (KNEE + 8.0, 8.0, 0.0, 0.6, True),
    "full": (8.0, 3.0, 3.0, 0.97, True),
    "stuck": (4.0, 2.0, 0.0, 0.3, False),
    "broken": (4.0, 0.0, 0.0, 0.3, True),
    # As quiet, but its KV cache dtype changes five minutes before AT (a redeploy).
    "changed": (4.0, 0.0, 0.0, 0.3, True),
}
XID = 79.0
CHANGED_AT = 75  # the step from which "changed" scrapes show the new cache dtype
EXPECTED = {
    "quiet": UNKNOWN,
    "busy": LOAD,
    "full": CAPACITY,
    "stuck": UPSTREAM,
    "broken": HARDWARE,
    "changed": SOFTWARE,
}


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, sessionmaker[Session]]:
    """One replica per scenario, 20 minutes of scrapes every 15 s up to AT, a sweep each."""
    tmp_path = tmp_path_factory.mktemp("causes")
    config_file = tmp_path / "kneepoint.yaml"
    targets = "".join(
        f"  - {{name: {name}, kind: vllm, url: 'http://127.0.0.1:9/{name}'"
        + (", gpus: ['cp-bm14r7/0']" if name == "broken" else "")
        + "}\n"
        for name in SCENARIOS
    )
    config_file.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\nscrape_interval: 15s\n"
        "dashboard_url: https://kneepoint.example.com\n"
        "channels:\n  - {name: hook, type: webhook, url: 'http://127.0.0.1:9/hook'}\n"
        f"targets:\n{targets}"
        "  - {name: gpu-node, kind: dcgm, url: 'http://127.0.0.1:9/gpus'}\n"
    )
    migrated(config_file)
    config = load_config(config_file)
    sessions = connect_store(config.database)
    base = parse_vllm(read(VLLM_032))
    gpu = parse_dcgm(read(DCGM_T4), default_host="gpu-node")[0]
    with sessions.begin() as session:
        ids = ensure_targets(session, [(t.name, t.kind, t.url) for t in config.targets])
        for step in range(80):
            ts = AT - 80 * 15 + (step + 1) * 15
            for name, (running, waiting, capacity, kv, moving) in SCENARIOS.items():
                sample = copy.deepcopy(base)
                sample.gauges.update(
                    requests_running=running,
                    requests_waiting=waiting,
                    requests_waiting_capacity=capacity,
                    kv_cache_usage=kv,
                )
                tick = step if moving else 0
                sample.counters["generation_tokens"] = 1000.0 + tick * 500.0
                sample.counters["prompt_tokens"] = 4000.0 + tick * 2000.0
                sample.counters["preemptions"] = 0.0
                if name == "changed" and step >= CHANGED_AT:
                    sample.cache = replace(sample.cache, cache_dtype="fp8")
                record_replica(session, ids[name], ts, sample)
            record_gpus(session, ids["gpu-node"], ts, [replace(gpu, xid_error=XID)])
        points = tuple(Point(c, 40.0 * min(c, KNEE) + 0.01 * c) for c in (1, 4, 16, KNEE, 64, 128))
        for name in SCENARIOS:
            save_run(session, Run(f"{name}-sweep", "m", "sweep", points), AT - 86400)
    return config, sessions


def test_gather_on_a_store_classifies_each_scenario(
    scenarios: tuple[Config, sessionmaker[Session]],
) -> None:
    config, sessions = scenarios
    with sessions() as session:
        signals = causes.gather(session, config, AT)
    by_name = {s.replica: s for s in signals.replicas}
    assert by_name["busy"].knee == KNEE
    assert by_name["busy"].concurrency == SCENARIOS["busy"][0] + SCENARIOS["busy"][1]
    found = {name: classify(signals, name) for name in SCENARIOS}
    assert {name: cause.kind for name, cause in found.items()} == EXPECTED, found
    assert f"XID {XID:.0f}" in found["broken"].evidence
    assert f"{SCENARIOS['full'][3]:.0%}" in found["full"].evidence
    # The stored configuration changed (kneepoint/timeline.py): a config change just before.
    assert found["changed"].evidence.startswith("changed config change at ")
    assert f"cache_dtype {base_dtype()} → fp8" in found["changed"].evidence
    assert found["changed"].secondary == ()


def base_dtype() -> str | None:
    return parse_vllm(read(VLLM_032)).cache.cache_dtype


def fire(
    config: Config,
    session: Session,
    rule_name: str,
    replica: str,
    pending_since: float | None = None,
    fingerprint: str = "",
) -> Notice:
    """Put one firing of a built-in rule (sent to `hook`) in the outbox; the stored notice."""
    rule = next(r for r in BUILT_IN if r.name == rule_name).model_copy(
        update={"channels": ["hook"]}
    )
    alert = Alert(
        fingerprint or f"{rule_name}-{replica}",
        rule_name,
        replica,
        FIRING,
        1.0,
        rule.threshold,
        pending_since=pending_since,
    )
    enqueue(session, config, [rule], [Transition(alert, PENDING, FIRING)], AT)
    row = session.scalars(
        select(NotificationRow).where(NotificationRow.fingerprint == alert.fingerprint)
    ).one()
    return Notice(**json.loads(row.notice))


def test_a_page_s_message_carries_its_likely_cause_and_runbook_link(
    scenarios: tuple[Config, sessionmaker[Session]],
) -> None:
    config, sessions = scenarios
    with sessions.begin() as session:
        page = fire(config, session, "kv-cache-saturated", "full")
        ticket = fire(config, session, "prefix-hit-rate-low", "full")
    assert page.cause.startswith(f"{CAPACITY}: ") and "97%" in page.cause
    text = page.text()
    assert f"likely cause: {page.cause}" in text
    assert "https://kneepoint.example.com/?page=alerts&rule=kv-cache-saturated" in text
    assert ticket.cause == ""  # a ticket carries no cause: only pages and SLO burns
    assert "rule=prefix-hit-rate-low" in ticket.runbook  # but its runbook link


def test_a_message_s_cause_weighs_only_changes_before_its_alert_went_pending(
    scenarios: tuple[Config, sessionmaker[Session]],
) -> None:
    """ "changed" changed its cache dtype a minute before AT: the cause of an alert that went
    pending after it, never of one pending since ten minutes before."""
    config, sessions = scenarios
    with sessions.begin() as session:
        after = fire(config, session, "engine-stalled", "changed", AT - 30, "after")
        before = fire(config, session, "engine-stalled", "changed", AT - 600, "before")
    assert after.cause.startswith(f"{SOFTWARE}: ") and "before the alert went pending" in (
        after.cause
    )
    assert before.cause.startswith(f"{UNKNOWN}: "), before.cause
    assert "in the hour before the alert went pending at " in before.cause
