"""kneepoint/audit.py: a mutation and its audit entry commit together or not at all; a
refusal writes its entry and nothing else; entries come back newest first; retention prunes
them with the other logs."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from alerts import silences
from kneepoint import audit
from kneepoint.auth import Identity, Refused
from kneepoint.config import Retention
from kneepoint.store.db import open_store
from kneepoint.store.models import AuditRow, SilenceRow
from kneepoint.store.rollup import rollup_in_slices

NOW = 1_800_000_000.0
OPERATOR = Identity("ops@example.com", "operator", "proxy", "ops@example.com", (), "10.0.0.7")
VIEWER = Identity("anonymous", "viewer", "none", address="192.168.1.9")


@pytest.fixture
def sessions(tmp_path: Path) -> sessionmaker[Session]:
    return open_store(f"sqlite:///{tmp_path / 'audit.db'}")


def count(sessions: sessionmaker[Session], model: type) -> int:
    with sessions() as session:
        return int(session.scalar(select(func.count()).select_from(model)) or 0)


def only_entry(sessions: sessionmaker[Session]) -> audit.Entry:
    with sessions() as session:
        (entry,) = audit.entries(session, 0.0)
    return entry


def test_a_mutation_commits_its_change_and_a_done_entry_together(
    sessions: sessionmaker[Session],
) -> None:
    with audit.mutation(
        sessions.begin, OPERATOR, "operator", "silence.create", "new silence", NOW
    ) as (session, change):
        number = silences.create(session, {"alertname": "x"}, NOW, NOW + 60, "ops", "why", NOW)
        change.subject = f"silence {number}"
        change.after = {"matchers": {"alertname": "x"}, "ends_at": NOW + 60}
    assert count(sessions, SilenceRow) == 1
    entry = only_entry(sessions)
    assert entry.as_dict() == {
        "id": entry.id,
        "ts": NOW,
        "actor": "ops@example.com",
        "role": "operator",
        "via": "proxy",
        "address": "10.0.0.7",
        "action": "silence.create",
        "outcome": "done",
        "subject": f"silence {number}",
        "before": None,
        "after": {"matchers": {"alertname": "x"}, "ends_at": NOW + 60},
        "detail": "",
    }


def test_a_refused_mutation_never_runs_and_writes_only_its_entry(
    sessions: sessionmaker[Session],
) -> None:
    ran = []
    with (
        pytest.raises(Refused, match="Creating a silence needs the operator role") as refused,
        audit.mutation(sessions.begin, VIEWER, "operator", "silence.create", "s", NOW) as (
            session,
            _,
        ),
    ):
        ran.append(True)
        silences.create(session, {"alertname": "x"}, NOW, NOW + 60, "a", "c", NOW)
    assert not ran
    assert count(sessions, SilenceRow) == 0
    entry = only_entry(sessions)
    assert (entry.actor, entry.role, entry.address, entry.outcome) == (
        "anonymous",
        "viewer",
        "192.168.1.9",
        "refused",
    )
    assert entry.detail == str(refused.value)
    assert "anonymous has the viewer role" in entry.detail


def test_a_policy_refusal_inside_the_change_rolls_it_back(
    sessions: sessionmaker[Session],
) -> None:
    with (
        pytest.raises(Refused, match="too broad"),
        audit.mutation(sessions.begin, OPERATOR, "operator", "silence.create", "s", NOW) as (
            session,
            change,
        ),
    ):
        silences.create(session, {"severity": "page"}, NOW, NOW + 60, "a", "c", NOW)
        change.after = {"matchers": {"severity": "page"}}
        raise Refused("too broad")
    assert count(sessions, SilenceRow) == 0
    entry = only_entry(sessions)
    assert (entry.outcome, entry.detail) == ("refused", "too broad")
    assert entry.after == {"matchers": {"severity": "page"}}  # what was attempted


def test_a_failing_change_is_rolled_back_recorded_as_failed_and_raised(
    sessions: sessionmaker[Session],
) -> None:
    with (
        pytest.raises(RuntimeError, match="disk full"),
        audit.mutation(sessions.begin, OPERATOR, "operator", "run.delete", "run bf16", NOW) as (
            session,
            change,
        ),
    ):
        silences.create(session, {"alertname": "x"}, NOW, NOW + 60, "a", "c", NOW)
        session.flush()  # written inside the transaction, then undone
        change.before = {"label": "bf16"}
        raise RuntimeError("disk full")
    assert count(sessions, SilenceRow) == 0
    entry = only_entry(sessions)
    assert (entry.outcome, entry.action, entry.subject) == ("failed", "run.delete", "run bf16")
    assert entry.detail == "RuntimeError: disk full"
    assert entry.before == {"label": "bf16"}  # what it meant to change, for the reader


def test_sign_ins_and_refusals_are_entries_too(sessions: sessionmaker[Session]) -> None:
    audit.sign_in(sessions.begin, OPERATOR, NOW)
    stranger = Identity("eve@elsewhere.io", None, "oidc", why_not="eve is not allowed")
    audit.sign_in(sessions.begin, stranger, NOW + 1)
    audit.refusal(sessions.begin, VIEWER, "page.open", "The Audit page", "needs admin", NOW + 2)
    with sessions() as session:
        entries = audit.entries(session, 0.0)
    assert [(e.action, e.actor, e.outcome, e.detail) for e in entries] == [
        ("page.open", "anonymous", "refused", "needs admin"),
        ("sign-in", "eve@elsewhere.io", "refused", "eve is not allowed"),
        ("sign-in", "ops@example.com", "done", ""),
    ]


def test_entries_are_newest_first_since_a_time_and_at_most_a_limit(
    sessions: sessionmaker[Session],
) -> None:
    times = [NOW + offset for offset in (30.0, 10.0, 50.0, 20.0, 40.0)]
    for ts in times:
        audit.refusal(sessions.begin, VIEWER, "run.delete", f"at {ts}", "no", ts)
    with sessions() as session:
        assert [e.ts for e in audit.entries(session, 0.0)] == sorted(times, reverse=True)
        assert [e.ts for e in audit.entries(session, NOW + 20)] == [
            NOW + 50,
            NOW + 40,
            NOW + 30,
            NOW + 20,
        ]
        assert [e.ts for e in audit.entries(session, 0.0, limit=2)] == [NOW + 50, NOW + 40]


def test_a_long_subject_is_cut_to_the_column_and_values_stay_json(
    sessions: sessionmaker[Session],
) -> None:
    with audit.mutation(sessions.begin, OPERATOR, "operator", "run.import", "x" * 500, NOW) as (
        _,
        change,
    ):
        change.after = {"stored": ["a", "b"], "refused": []}
    entry = only_entry(sessions)
    assert entry.subject == "x" * 200
    assert entry.after == {"stored": ["a", "b"], "refused": []}


def test_retention_prunes_audit_entries_older_than_retention_audit(
    sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kneepoint.store import rollup as rollups

    monkeypatch.setattr(rollups, "DELETE_BATCH", 7)  # several batches
    retention = Retention()
    now = NOW
    old = now - retention.audit - 3600.0
    kept = now - retention.audit + 3600.0
    with sessions.begin() as session:
        for index in range(20):
            for ts in (old, kept):
                change = audit.Change(f"silence {index}")
                audit.record(session, OPERATOR, "silence.create", "done", change, ts + index)
    result = rollup_in_slices(sessions, now, retention)
    with sessions() as session:
        left = list(session.scalars(select(AuditRow.ts)))
    assert len(left) == 20 and min(left) >= kept
    assert result.pruned == 20
    # A shorter retention from the config prunes those too.
    shorter = Retention(audit=retention.audit - 2 * 86400.0)
    assert rollup_in_slices(sessions, now, shorter).pruned == 20
    assert count(sessions, AuditRow) == 0


def test_audit_retention_must_be_positive() -> None:
    with pytest.raises(ValueError, match="audit retention must be positive"):
        Retention(audit=0)
    assert Retention().audit == 400 * 86400.0
