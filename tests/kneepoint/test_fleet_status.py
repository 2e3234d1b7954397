"""The fleet's one status (kneepoint/fleet_status.py): each branch of its rule, the reasons
and their links, and the status line."""

from __future__ import annotations

import pytest

from kneepoint.fleet_status import (
    BURNING,
    COLOURS,
    DEGRADED,
    DOWN,
    LEVELS,
    OK,
    PAGING,
    AlertState,
    ReplicaState,
    SloState,
    assess,
    ordered,
)

SERVING = ReplicaState("a", up=True)
OTHER = ReplicaState("b", up=True)
VIEW = {"page": "capacity", "range": "1h", "replica": "a"}


def alert(
    severity: str, state: str = "firing", rule: str = "r", replica: str = "a", metric: str = ""
) -> AlertState:
    return AlertState(rule, replica, state, severity, since=1000.0, metric=metric, view=VIEW)


def test_nothing_wrong_is_ok() -> None:
    status = assess([], [SloState("s", budget_left=0.5, burn_rate=0.3)], [SERVING, OTHER])
    assert status.level == OK and status.reasons == () and status.summary() == "OK"


def test_pending_and_info_alerts_are_noted_not_reasons() -> None:
    alerts = [alert("page", "pending"), alert("ticket", "pending"), alert("info", "firing")]
    status = assess(alerts, [], [SERVING])
    assert status.level == OK and status.reasons == ()
    assert status.notes == ("2 pending", "1 info firing")
    assert status.summary() == "OK · 2 pending · 1 info firing"


def test_a_page_alert_while_every_replica_serves_is_paging_never_down() -> None:
    kv = alert("page", rule="kv-cache-saturated", metric="kv_cache_occupancy")
    status = assess([alert("ticket"), kv], [], [SERVING, OTHER])
    assert status.level == PAGING and status.label == "Paging"
    first = status.reasons[0]  # the paging reason before the degraded one
    assert (first.level, first.kind, first.subject) == (PAGING, "alert", "kv-cache-saturated")
    assert first.view == VIEW
    assert first.text == "kv-cache-saturated firing on a (page)"
    assert status.summary() == (
        "Paging: kv-cache-saturated firing on a (page) · Degraded: r firing on a (ticket)"
    )
    # A replica-health page alert is no "Down" while every replica serves (a scrape since).
    target_down = alert("page", rule="target-down", metric="up")
    assert assess([target_down], [], [SERVING, OTHER]).level == PAGING


def test_a_replica_health_page_alert_is_down_while_a_replica_does_not_serve() -> None:
    target_down = alert("page", rule="target-down", metric="up")
    status = assess([target_down], [], [ReplicaState("a", up=False), OTHER])
    assert status.level == DOWN
    assert {(r.kind, r.level) for r in status.reasons} == {("alert", DOWN), ("replica", DOWN)}
    assert status.summary() == "Down: 1 of 2 replicas down"  # the same fact, said once


def test_an_slo_burning_with_every_replica_serving_is_burning_not_down() -> None:
    slo = SloState("avail", budget_left=0.4, burn_rate=20.0, burning=("1h",))
    burn = alert("page", rule="avail-burn-1h", replica="", metric="slo_burn:avail:1h")
    replicas = [ReplicaState(name, up=True) for name in "abcd"]
    status = assess([burn], [slo], replicas)
    assert status.level == BURNING and status.colour == COLOURS[BURNING] != COLOURS[DOWN]
    # The page alert is the SLO's burn: said once, by the SLO's own reason.
    assert [r.text for r in status.reasons] == ["SLO avail: burning over 1h"]
    assert status.summary() == "Burning: SLO avail burning over 1h"


def test_a_burn_alert_without_its_slo_report_is_burning_by_itself() -> None:
    burn = alert("page", rule="avail-burn-1h", replica="", metric="slo_burn:avail:1h")
    status = assess([burn], [SloState("avail", budget_left=0.9)], [SERVING])
    assert status.level == BURNING
    assert status.summary() == "Burning: avail-burn-1h firing on fleet (page)"


def test_levels_rank_down_over_burning_over_paging_over_degraded() -> None:
    assert LEVELS == (OK, DEGRADED, PAGING, BURNING, DOWN)
    everything = assess(
        [alert("ticket"), alert("page", rule="kv", metric="kv_cache_occupancy")],
        [SloState("s", budget_left=-0.5)],
        [ReplicaState("a", up=True, stalled=True), OTHER, SERVING, ReplicaState("d", up=True)],
    )
    assert everything.level == DOWN
    assert [r.level for r in everything.reasons] == [DOWN, BURNING, PAGING, DEGRADED]
    assert everything.summary() == (
        "Down: 1 of 4 replicas stalled · Burning: SLO s budget exhausted · "
        "Paging: kv firing on a (page) · Degraded: r firing on a (ticket)"
    )


def test_past_named_alerts_a_segment_counts_them() -> None:
    pages = [alert("page", rule=f"p{i}", metric="xid_errors") for i in range(3)]
    assert assess(pages, [], [SERVING]).summary() == "Paging: 3 page alerts firing"


@pytest.mark.parametrize("severity", ["ticket", "critical"])
def test_a_firing_ticket_or_unknown_severity_alert_is_degraded(severity: str) -> None:
    status = assess([alert(severity, replica="")], [], [SERVING])
    assert status.level == DEGRADED
    assert [r.text for r in status.reasons] == [f"r firing on fleet ({severity})"]


def test_no_replica_serving_is_down() -> None:
    replicas = [
        ReplicaState("a", up=False, last_error="connection refused"),
        ReplicaState("b", up=False, stale=True),
        ReplicaState("c", up=True, stalled=True),
        ReplicaState("never", up=None),  # never scraped: not counted either way
    ]
    status = assess([], [], replicas)
    assert status.level == DOWN
    assert status.reasons[0].kind == "fleet" and "3 of 3" in status.reasons[0].text
    troubles = {r.subject: r.text for r in status.reasons if r.kind == "replica"}
    assert troubles == {"a": "a down", "b": "b stale", "c": "c stalled"}
    assert status.summary() == (
        "Down: no replica serving; 1 of 3 replicas down; 1 of 3 replicas stale; "
        "1 of 3 replicas stalled"
    )


def test_replicas_down_while_one_serves_is_down_saying_how_many() -> None:
    status = assess([], [], [ReplicaState("a", up=False), ReplicaState("b", up=False), OTHER])
    assert status.level == DOWN
    assert status.summary() == "Down: 2 of 3 replicas down"
    views = {r.subject: r.view for r in status.reasons}
    assert views["a"] == {"page": "health", "range": "1h", "replica": "a"}


def test_never_scraped_or_no_replicas_is_not_down() -> None:
    assert assess([], [], [ReplicaState("a", up=None)]).level == OK
    assert assess([], [], []).level == OK


@pytest.mark.parametrize(
    ("replica", "trouble", "page"),
    [
        (ReplicaState("x", up=False), "down", "health"),
        (ReplicaState("x", up=False, stale=True), "stale", "health"),
        (ReplicaState("x", up=True, stalled=True), "stalled", "overview"),
    ],
)
def test_a_replica_in_trouble_is_down(replica: ReplicaState, trouble: str, page: str) -> None:
    status = assess([], [], [replica, SERVING])
    assert status.level == DOWN
    assert status.summary() == f"Down: 1 of 2 replicas {trouble}"
    (reason,) = status.reasons
    assert reason.text == f"x {trouble}" and reason.view["page"] == page
    assert reason.view["replica"] == "x"


def test_an_exhausted_budget_is_burning() -> None:
    status = assess([], [SloState("fast-ttft", budget_left=-0.2, burn_rate=3.0)], [SERVING])
    assert status.level == BURNING
    (reason,) = status.reasons
    assert reason.text == "SLO fast-ttft: error budget exhausted"
    assert reason.view == {"page": "slos", "range": "1h", "slo": "fast-ttft"}
    assert assess([], [SloState("s", budget_left=0.0)], [SERVING]).level == BURNING


def test_a_burning_slo_is_burning() -> None:
    slo = SloState("avail", budget_left=0.9, burn_rate=20.0, burning=("1h", "6h"))
    status = assess([], [slo], [SERVING])
    assert status.level == BURNING
    assert [r.text for r in status.reasons] == ["SLO avail: burning over 1h, 6h"]
    assert status.summary() == "Burning: SLO avail burning over 1h, 6h"
    both = SloState("b", budget_left=-1.0, burning=("6h",))
    many = [slo, both, SloState("c", budget_left=-0.1)]
    assert assess([], [both], [SERVING]).summary() == (
        "Burning: SLO b budget exhausted and burning over 6h"
    )
    assert assess([], many, [SERVING]).summary() == (
        "Burning: 2 SLOs burning, 2 SLO budgets exhausted"
    )


def test_an_slo_without_data_or_with_a_problem_is_no_reason() -> None:
    slos = [
        SloState("empty", budget_left=None),
        SloState("wrong", budget_left=-1.0, burning=("1h",), problem="not a bucket bound"),
    ]
    assert assess([], slos, [SERVING]).level == OK


def test_from_status_reads_kneepoint_status_entries() -> None:
    entry = {"name": "a", "up": False, "stale": True, "stalled": None, "last_error": "refused"}
    replica = ReplicaState.from_status(entry)
    assert (replica.up, replica.stale, replica.stalled, replica.trouble) == (
        False,
        True,
        False,
        "stale",
    )


def test_ordered_puts_firing_pages_first_then_longest() -> None:
    alerts = [
        AlertState("p", "a", "pending", "page", since=1.0),
        AlertState("i", "a", "firing", "info", since=1.0),
        AlertState("t", "a", "firing", "ticket", since=1.0),
        AlertState("late", "a", "firing", "page", since=50.0),
        AlertState("early", "a", "firing", "page", since=10.0),
    ]
    assert [a.rule for a in ordered(alerts)] == ["early", "late", "t", "i", "p"]


def test_an_asleep_replica_is_a_note_not_trouble() -> None:
    entry = {"name": "s", "up": True, "stale": False, "stalled": False, "asleep": True}
    asleep = ReplicaState.from_status({**entry, "sleep_state": "weights offloaded"})
    assert asleep.asleep_label == "asleep (weights offloaded)"
    assert asleep.trouble is None and asleep.serving
    status = assess([], [], [asleep, SERVING])
    assert status.level == OK and status.reasons == ()
    assert status.summary() == "OK · 1 replica asleep"
    # Down or stale, it is that trouble, whatever its last sleep state said.
    down = ReplicaState("d", up=False, asleep="weights offloaded")
    assert down.asleep_label is None and assess([], [], [down, SERVING]).level == DOWN
    awake = ReplicaState.from_status({**entry, "asleep": False, "sleep_state": "awake"})
    assert awake.asleep_label is None and assess([], [], [awake]).summary() == "OK"
