"""Who the collectors are, read from the store: each recorded collector (collectors/cluster.py
registers and beats them), live or gone, and which one leads. On PostgreSQL a member's own
advisory lock and the leader lock, read back from pg_locks, say who is live and who leads;
elsewhere the lease alone decides. Read by the collectors themselves (their share of the
targets) and by the health check (`kneepoint health`, the Collector health page), which must
not need the collector's runtime to list them."""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass

from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from kneepoint.store.errors import describe
from kneepoint.store.models import CollectorRow

log = logging.getLogger(__name__)

# Advisory lock keys (non-negative, below 2**31, so they read back unchanged in pg_locks).
LEADER_LOCK = zlib.crc32(b"kneepoint leader") & 0x7FFFFFFF  # one bigint key
MEMBER_LOCKS = zlib.crc32(b"kneepoint collector") & 0x7FFFFFFF  # key 1 of (key 1, member)


def member_key(member_id: str) -> int:
    """Key 2 of a member's own advisory lock."""
    return zlib.crc32(member_id.encode()) & 0x7FFFFFFF


@dataclass(frozen=True)
class Member:
    id: str
    host: str
    pid: int
    started_at: float
    last_seen_at: float
    leader_since: float | None
    targets: int | None  # targets held at its last round
    live: bool
    leader: bool


def is_postgres(sessions_or_session: sessionmaker[Session] | Session) -> bool:
    if isinstance(sessions_or_session, Session):
        bind = sessions_or_session.get_bind()
    else:
        bind = sessions_or_session.kw["bind"]
    return bool(bind.dialect.name == "postgresql")


def held_locks(session: Session) -> tuple[dict[int, int], int | None] | None:
    """On PostgreSQL: the backend pid holding each member lock (by member key), and the
    pid holding the leader lock; None elsewhere or where pg_locks cannot be read."""
    if not is_postgres(session):
        return None
    try:
        rows = session.execute(
            text(
                "SELECT classid::bigint, objid::bigint, objsubid, pid FROM pg_locks "
                "WHERE locktype = 'advisory' AND granted AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())"
            )
        ).all()
    except Exception as error:  # a restricted role: the lease alone decides
        log.warning("pg_locks cannot be read (%s): membership by the lease only", describe(error))
        session.rollback()
        return None
    members: dict[int, int] = {}
    leader = None
    for classid, objid, objsubid, pid in rows:
        if objsubid == 2 and classid == MEMBER_LOCKS:
            members[int(objid)] = int(pid)
        elif objsubid == 1 and classid == 0 and objid == LEADER_LOCK:
            leader = int(pid)
    return members, leader


def membership(session: Session, lease: float, now: float) -> list[Member]:
    """Every recorded collector, oldest first: live or gone, and which one leads (on
    PostgreSQL: the one whose own lock is held by the session holding the leader lock)."""
    rows = list(session.scalars(select(CollectorRow).order_by(CollectorRow.started_at)))
    locks = held_locks(session)
    found = []
    for row in rows:
        recent = now - row.last_seen_at <= lease
        pid = None if locks is None else locks[0].get(member_key(row.id))
        live = recent and (locks is None or pid is not None)
        leader = locks is not None and pid is not None and pid == locks[1]
        found.append(
            Member(
                row.id,
                row.host,
                row.pid,
                row.started_at,
                row.last_seen_at,
                row.leader_since,
                row.targets,
                live,
                leader,
            )
        )
    return found
