"""The chaos run in CI: one minute of bench/chaos.py with every kind of fault (collector
SIGKILLed, database locked, disk full, clock stepped back and forward, targets flapping,
receiver failing and out), then its verdict on counts from the store's and the receiver's
own records: no row lost, no notification lost, no firing alert without news, no resolution
without a recovery. Beside it: the counting rules themselves on made-up records (so a rule
that excused everything would fail here), and the cause of the 2 "lost" rows of an earlier
20-minute run: a trickled 200 is a delivery for the outbox, and its body never finishes."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import select

from alerts.outbox import deliver_due, http_sender
from kneepoint.store.db import open_store
from kneepoint.store.models import NotificationRow
from tests.faults.test_delivery import NOW, fire, outbox, rule_to

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import chaos

DEADLINE = 3.0


def test_one_minute_of_chaos_loses_no_row_and_no_notification(tmp_path: Path) -> None:
    figures = chaos.chaos(minutes=1, seed=3, folder=tmp_path, interval=1.0)
    shown = json.dumps(figures, indent=1, default=str)
    faults = figures["faults"]
    # Every kind of fault was made (the run makes any it had no time for before it stops).
    assert faults["collector_kills"] >= 1, shown
    assert faults["database_locks"] >= 1, shown
    assert faults["disk_full"] >= 1, shown
    assert faults["clock_steps_back"] >= 1, shown
    assert faults["clock_steps_forward"] >= 1, shown
    assert sum(faults["target_flaps"].values()) >= 1, shown
    assert sum(faults["receiver_outages"].values()) >= 1, shown
    # Rows: every served body stored whole, or not stored for a recorded cause.
    assert figures["rows_stored"] > 0, shown
    assert figures["rows_lost"] == 0, shown
    assert figures["rows_stored_from_no_served_body"] == 0, shown
    assert figures["serials_excused_as_refused"] <= figures["samples_refused_recorded"], shown
    assert figures["integrity_check"] == "ok", shown
    assert figures["collector_exits_unasked"] == [], shown
    # Notifications: news flowed, and none was lost or resolved without a recovery.
    assert figures["firing_transitions"] >= 1 and figures["delivered"] >= 1, shown
    assert figures["lost"] == 0, shown
    assert figures["deliveries_of_unknown_rows"] == 0, shown
    assert figures["firing_alerts_without_news"] == [], shown
    assert figures["silent_resolves"] == 0, shown
    assert figures["resolved_sent_without_recovery"] == [], shown


def _front(kind: str, requests: list[chaos.Request]) -> chaos.Front:
    front = chaos.Front("http://unused", kind, lambda: 1)
    front.requests = requests
    return front


def _served(serial: int, at: float, generation: int = 1) -> chaos.Request:
    return chaos.Request(serial, generation, at, "served", 0.1)


def test_a_served_body_missing_in_quiet_time_is_lost_and_one_with_a_cause_is_excused() -> None:
    requests = [_served(n, 10.0 * n) for n in range(1, 7)]
    fronts = {"a": _front("vllm", requests), "node": _front("dcgm", [_served(1, 10.0)])}
    ends = {1: 100.0}
    # Serial 2 (at 20 s) missing with nothing recorded near it: lost. Serial 6 is the last
    # request of its process: in flight at the stop. The node's serial 1 has 1 GPU of 2.
    stored = {"a": Counter({1: 1, 3: 1, 4: 1, 5: 1}), "node": Counter({1: 1})}
    counted = chaos.account_rows(fronts, stored, [], ends)
    assert counted["rows_expected"] == 6 + 2
    assert counted["rows_lost"] == 1 + 1
    assert {(one["target"], one["serial"]) for one in counted["lost_row_serials"]} == {
        ("a", 2),
        ("node", 1),
    }
    assert counted["rows_not_stored_excused"] == {
        "in flight when its process was killed or stopped": 1
    }
    # A database lock between serial 2's request and the next one: its round's write failed.
    lock = chaos.Episode("lock", 25.0, 28.0)
    fronts["node"].requests = []
    counted = chaos.account_rows(fronts, stored, [lock], ends)
    assert counted["rows_lost"] == 0
    # A lock that ended before serial 2 was requested does not excuse it.
    early = chaos.Episode("lock", 5.0, 19.0)
    assert chaos.account_rows(fronts, stored, [early], ends)["rows_lost"] == 1


def test_a_clock_step_back_excuses_rows_only_within_its_refusal_window() -> None:
    # A step back of 15 s made at 12 s, applied at 13 s: refusals until at most 28 s.
    back = chaos.Episode("clock-back", 12.0, 13.0, -15.0)
    assert chaos.refusal_windows([back]) == [(12.0, 28.0)]
    # Forward 30 s, then back 10 s at 40 s, applied by 41 s: the clock had read up to
    # 41 + 30 and reads r + 20 after: refusals until at most 51 s.
    forward = chaos.Episode("clock-forward", 12.0, 13.0, 30.0)
    small_back = chaos.Episode("clock-back", 40.0, 41.0, -10.0)
    assert chaos.refusal_windows([forward, small_back]) == [(40.0, 51.0)]
    assert chaos.refusal_windows([forward]) == []  # forward alone refuses nothing
    # Two steps back in a row: the second's window runs until the first's high mark
    # is passed again (13 s + 0 offset, read again after 15 + 10 s of steps back).
    second = chaos.Episode("clock-back", 20.0, 21.0, -10.0)
    assert chaos.refusal_windows([back, second]) == [(12.0, 28.0), (20.0, 38.0)]
    requests = [_served(n, 10.0 * n) for n in range(1, 7)]
    fronts = {"a": _front("vllm", requests)}
    # Serial 4 (requested at 40 s, its clock read after serial 3's request at 30 s) missing:
    # after the first window, within the second.
    stored = {"a": Counter({1: 1, 2: 1, 3: 1, 5: 1, 6: 1})}
    assert chaos.account_rows(fronts, stored, [back], {1: 100.0})["rows_lost"] == 1
    excused = chaos.account_rows(fronts, stored, [back, second], {1: 100.0})
    assert excused["rows_lost"] == 0 and excused["serials_excused_as_refused"] == 1


@pytest.mark.parametrize("fault", [None, "trickle", "500", "429", "close", "hang"])
def test_only_a_trickled_200_is_sent_for_the_outbox_while_its_body_never_finishes(
    fault: str | None, tmp_path: Path
) -> None:
    """The cause of the earlier run's 2 "lost" rows, both `sent` in the outbox: the bench
    then counted a delivery only when the receiver finished its answer's body. For each
    answer the chaos receiver gives, what the real outbox records and whether the body was
    finished: `sent` without a finished body happens for a trickled 200 and nothing else,
    so under that rule the trickled 200s, and only they, were `sent` and "lost"."""
    receiver = chaos.Receiver(chaos.random.Random(0), fault_rate=0.0, outage=fault)
    config = outbox(tmp_path, {"hook": receiver.start()})
    sessions = open_store(config.database)
    fire(sessions, config, rule_to("hook"))
    with sessions() as session:
        deliver_due(session, config, NOW, http_sender(DEADLINE), deadline=DEADLINE)
    with sessions() as session:
        row = session.scalars(select(NotificationRow)).one()
        key = chaos._key(row)
    # What each try got, once the receiver's thread has finished with it (a trickle is cut
    # when kneepoint closes the connection after its deadline: the next byte fails).
    deadline = time.monotonic() + 60
    while fault == "trickle" and time.monotonic() < deadline:
        if "trickle, cut" in receiver.history.get(key, []):
            break
        time.sleep(0.2)
    history = receiver.history.get(key, [])
    body_finished = "200" in history
    assert (row.state == "sent") == (fault in (None, "trickle")), (row.state, history)
    assert receiver.acknowledged[key] == (1 if fault in (None, "trickle") else 0)
    assert body_finished == (fault is None), history
    if fault == "trickle":
        assert history == ["trickle", "trickle, cut"]  # the 2xx went out, the body never did


def _row(id_: int, state: str, error: str | None = None) -> NotificationRow:
    return NotificationRow(id=id_, state=state, last_error=error)


def test_a_firing_superseded_by_a_muted_row_is_news_nobody_got() -> None:
    """The judge of firing news: a firing superseded by its sent resolution (or by a newer
    firing that was sent) was dropped by design; one superseded by a muted (inhibited) row
    never reached anyone while the alert still fired (the 20-minute run's one finding)."""
    rows = {
        1: _row(1, "superseded", "superseded by #2"),
        2: _row(2, "sent"),  # its resolution
        3: _row(3, "superseded", "superseded by #4"),
        4: _row(4, "superseded", "superseded by #5"),
        5: _row(5, "muted", "inhibited: replica-a is down"),
        6: _row(6, "pending"),
    }
    assert chaos._dropped_by_design(rows[1], rows)
    assert chaos._dropped_by_design(rows[5], rows)  # muted when made: by design
    assert not chaos._dropped_by_design(rows[4], rows)
    assert not chaos._dropped_by_design(rows[3], rows)  # its chain ends in a muted row
    assert not chaos._dropped_by_design(rows[6], rows)


def test_an_episode_whose_end_a_clock_step_made_earlier_still_holds_its_firing() -> None:
    """The 20-minute run at af61712: an alert fired at t=771.6, then the clock stepped back
    and it resolved at t=762.2 (by commit order, after). Its rows: the firing (#4, made at
    its start), a firing → firing (#5, at 776.6), both superseded by the resolution (#6, at
    762.2). A window from start to end held no row, and the judge called it a firing
    without news."""

    def made(id_: int, at: float) -> NotificationRow:
        return NotificationRow(id=id_, fingerprint="fp", alert_keys=None, created_at=at)

    rows = [made(4, 771.6), made(5, 776.6), made(6, 762.2), made(7, 900.0)]
    assert [r.id for r in chaos.episode_rows(rows, "fp", 771.6, 762.2)] == [4]
    assert [r.id for r in chaos.episode_rows(rows, "fp", 771.6, 800.0)] == [4, 5]
    assert chaos.episode_rows(rows, "other", 771.6, 800.0) == []
