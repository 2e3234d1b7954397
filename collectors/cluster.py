"""Several collectors on one PostgreSQL database: who is there, who scrapes what, who leads.

Membership. Each collector (`kneepoint collect`, `kneepoint serve`) has a row in
`collectors` (id `host:pid:random`, host, pid, started_at, last_seen_at), beaten every
`collector.lease / 3` seconds, deleted at a clean shutdown. On PostgreSQL each collector
also holds a session-level advisory lock of its own (the two-key form: MEMBER_LOCKS and a
hash of its id) on one dedicated connection. A member is live when its row was seen within
`collector.lease` and, on PostgreSQL, its lock is held: a collector killed with SIGKILL
loses its connection, PostgreSQL ends that session and releases its locks, and the others
count it gone at their next round instead of after the lease. (The lease alone decides
where locks are not readable, and for a collector whose host vanished without closing its
connection until the keepalives below end it.)

The split. Each round, a collector scrapes only the targets whose rendezvous (highest
random weight) hash over the live member ids names it: every collector computes the same
owner for every target from the same member list, without talking to the others, and a
join or a death moves only the targets that belong to the newcomer or the dead one.
Members read the list at the start of their own rounds, which are not aligned, so around a
change a target may be scraped twice in one round (the newcomer already counts itself, the
others not yet: two valid samples a fraction of an interval apart; in Prometheus mode the
same scrape read twice, the second refused as not newer and counted in `samples_refused`)
or missed for one round (a member's death or leave seen by the others only at their next
round; with pg_locks unreadable, a killed member's targets wait for its lease to run out). A
collector whose own connection broke keeps its share while the others have taken it over:
overlap, never a gap, until it reconnects.

The leader. Alert evaluation, delivery of the outbox, rollups, the weekly report and the
heartbeat run on one collector: the holder of a session-level advisory lock
(`pg_try_advisory_lock(LEADER_LOCK)`) on the same dedicated connection. Chosen over a lease
row because PostgreSQL itself releases the lock the moment the holder's session ends (a
killed process's socket is closed by its kernel), so a follower takes over at its next try
(every beat, and before each leader-only job: within one evaluation interval), not after a
lease that has to be longer than the worst pause of a live leader; no clocks are compared;
and a live leader never loses it to a slow beat. The cost: the lock lives only as long as
the connection, which must go straight to PostgreSQL or through a pooler in session mode
(PgBouncer's transaction mode would hand the session to others). The dedicated connection
sets TCP keepalives and a user timeout, so a leader whose host vanished is let go within
about ten seconds rather than the system's two hours.

Delivery stays with the leader, though the outbox's claims (`FOR UPDATE SKIP LOCKED`, a
lease per row: alerts/outbox.py) make concurrent senders safe against sending a row twice:
a channel's `per_minute` limit is counted from committed sends at the start of each
claiming round, so N concurrent senders could each send up to the limit; one sender keeps
it exact. Rows a killed leader had claimed are sent again by the next once their lease
ends, as the outbox promises for any sender that dies.

Evaluation is also serialized by a transaction-level advisory lock (`serialize_evaluation`):
should two collectors ever both believe they lead (the old leader's connection cut by the
server while it is mid-round), their rounds run one after the other and the second sees the
first's alert states, so a firing alert is not enqueued twice.

On SQLite nothing changes: no locks, every collector scrapes every target and runs every
job (one collector per SQLite file is the supported set-up); membership is still recorded,
for `kneepoint health` and the Collector health page.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import uuid
import zlib
from collections.abc import Sequence

from sqlalchemy import Connection, Engine, Table, delete, insert, text, update
from sqlalchemy.orm import Session, sessionmaker

from kneepoint.clock import Clock
from kneepoint.config import Config, Target
from kneepoint.job_intervals import beat_every
from kneepoint.store.errors import describe
from kneepoint.store.membership import (
    LEADER_LOCK,
    MEMBER_LOCKS,
    Member,
    is_postgres,
    member_key,
    membership,
)
from kneepoint.store.models import CollectorRow

log = logging.getLogger(__name__)

# The evaluation's advisory lock key (the members' and the leader's: kneepoint/store/membership.py).
EVALUATION_LOCK = zlib.crc32(b"kneepoint evaluation") & 0x7FFFFFFF  # per transaction
_COLLECTORS: Table = CollectorRow.__table__  # type: ignore[assignment]
FORGET_AFTER = 3600.0  # a gone member's row is deleted by the leader after this long
# The dedicated connection: the server notices a vanished client within ~10 s; no idle
# timeout configured on the server ends the session that holds the locks.
SESSION_SETTINGS = (
    "tcp_keepalives_idle = 5",
    "tcp_keepalives_interval = 2",
    "tcp_keepalives_count = 3",
    "tcp_user_timeout = 10000",
    "idle_session_timeout = 0",
    "idle_in_transaction_session_timeout = 0",
)


class NotLeader:
    """What a leader-only job returns on a follower: it did not run, and did not fail
    (collectors/jobs.record_job_event records nothing for it)."""

    def __repr__(self) -> str:
        return "NOT_LEADER"


NOT_LEADER = NotLeader()


def weight(member_id: str, target: str) -> int:
    digest = hashlib.blake2b(f"{member_id}\0{target}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner(target: str, members: Sequence[str]) -> str:
    """The member that scrapes `target`: the highest rendezvous weight (ties by id)."""
    return max(members, key=lambda member: (weight(member, target), member))


def serialize_evaluation(session: Session) -> None:
    """Hold the evaluation lock until `session`'s transaction ends (PostgreSQL only)."""
    if is_postgres(session):
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": EVALUATION_LOCK})


class Cluster:
    """This collector's membership, share of the targets and leadership. Safe to call from
    the scheduler's threads at once; nothing touches the database before the first call."""

    def __init__(
        self,
        config: Config,
        sessions: sessionmaker[Session],
        clock: Clock,
        member_id: str | None = None,
    ) -> None:
        self.config = config
        self.sessions = sessions
        self.clock = clock
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.id = member_id or f"{self.host}:{self.pid}:{uuid.uuid4().hex[:8]}"
        self.started_at: float | None = None
        self._guard = threading.RLock()  # the dedicated connection
        self._beating = threading.Lock()
        self._writing = threading.Lock()  # this member's row
        self._connection: Connection | None = None
        self._leading = False
        self._held: int | None = None
        self._left = False

    @property
    def lease(self) -> float:
        return self.config.collector.lease

    @property
    def every(self) -> float:
        """Seconds between beats."""
        return beat_every(self.lease)

    def postgres(self) -> bool:
        return is_postgres(self.sessions)

    # Membership

    def beat(self) -> None:
        """Refresh this collector's row (register it the first time), hold its lock, try
        for the leadership, and as leader forget members gone for an hour."""
        with self._beating:  # the scrape's first round and the first beat run at once
            if self._left:
                return
            if self.postgres():
                with self._guard:
                    self._connect()
            self._record()
        if self.is_leader():
            with self.sessions.begin() as session:
                session.execute(
                    delete(CollectorRow).where(
                        CollectorRow.last_seen_at < self.clock() - FORGET_AFTER
                    )
                )

    def _record(self, leader_since: float | None = None) -> None:
        with self._writing:  # the beat and a leader-only job's first leadership, at once
            self._write(leader_since)

    def _write(self, leader_since: float | None) -> None:
        """This collector's row: one UPDATE (an INSERT the first time), not the ORM's load
        and flush, which cost several times as much on every beat."""
        now = self.clock()
        values: dict[str, object] = {"last_seen_at": now}
        if self._held is not None:
            values["targets"] = self._held
        if leader_since is not None:
            values["leader_since"] = leader_since
        with self.sessions.begin() as session:
            connection = session.connection()
            beaten = connection.execute(
                update(_COLLECTORS).where(_COLLECTORS.c.id == self.id).values(values)
            )
            if beaten.rowcount == 0:  # not registered yet (or its row was removed)
                self.started_at = self.started_at or now
                connection.execute(
                    insert(_COLLECTORS).values(
                        id=self.id,
                        host=self.host[:255],
                        pid=self.pid,
                        started_at=self.started_at,
                        **values,
                    )
                )

    def members(self) -> list[Member]:
        with self.sessions() as session:
            return membership(session, self.lease, self.clock())

    def share(self, targets: list[Target]) -> list[Target]:
        """The targets this collector scrapes this round (all of them off PostgreSQL)."""
        if not self.postgres():
            self._held = len(targets)
            return targets
        if self.started_at is None:  # not registered yet: join before taking a share
            self.beat()
        live = [m.id for m in self.members() if m.live]
        if self.id not in live:  # it knows it is alive, even while its lock is being retaken
            live.append(self.id)
        mine = [t for t in targets if owner(t.name, live) == self.id]
        if len(mine) != self._held:
            log.info(
                "collector %s scrapes %d of %d targets (%d live collectors)",
                self.id,
                len(mine),
                len(targets),
                len(live),
            )
        self._held = len(mine)
        return mine

    def leave(self) -> None:
        """A clean shutdown: give up the locks and delete this collector's row, so the
        others take its targets and the leadership at their next round."""
        self._left = True
        with self._guard:
            # Released here, not only by closing: the server frees a closed session's locks
            # when its backend exits, a moment later, so a follower's next try could miss.
            if self._connection is not None and not self._connection.closed:
                try:
                    self._connection.execute(text("SELECT pg_advisory_unlock_all()"))
                except Exception as error:  # the session is gone, and its locks with it
                    log.debug("releasing the locks: %s", describe(error))
            self._drop()
        try:
            with self.sessions.begin() as session:
                session.execute(delete(CollectorRow).where(CollectorRow.id == self.id))
        except Exception as error:  # the row goes stale and is counted gone after the lease
            log.warning("collector %s could not remove itself: %s", self.id, describe(error))

    # Leadership

    def is_leader(self) -> bool:
        """Whether this collector leads now: always off PostgreSQL; on PostgreSQL, whether
        it holds the leader lock, trying for it when it does not."""
        if not self.postgres():
            return True
        if self._left:
            return False
        with self._guard:
            connection = self._connect()
            if connection is None:
                return False
            try:
                if self._leading:
                    connection.execute(text("SELECT 1"))  # the session, and so the lock, lives
                    return True
                got = bool(
                    connection.execute(
                        text("SELECT pg_try_advisory_lock(:key)"), {"key": LEADER_LOCK}
                    ).scalar()
                )
            except Exception as error:  # the session is gone, and its locks with it
                log.warning("collector %s lost its lock connection: %s", self.id, describe(error))
                self._drop()
                return False
            if not got:
                return False
            self._leading = True
        now = self.clock()
        log.warning("collector %s is now the leader", self.id)
        try:
            self._record(leader_since=now)
        except Exception as error:  # shown late; the lock is what counts
            log.warning("collector %s: leader_since not recorded: %s", self.id, describe(error))
        return True

    def _engine(self) -> Engine:
        engine: Engine = self.sessions.kw["bind"]
        return engine

    def _connect(self) -> Connection | None:
        """The dedicated connection holding this member's locks, opened (and the member
        lock taken) when there is none; None when the server cannot be reached."""
        if self._connection is not None and not self._connection.closed:
            return self._connection
        self._leading = False
        try:
            connection = self._engine().connect()
            connection.execution_options(isolation_level="AUTOCOMMIT")
        except Exception as error:
            log.warning("collector %s: no lock connection: %s", self.id, describe(error))
            return None
        try:
            for setting in SESSION_SETTINGS:
                try:
                    connection.exec_driver_sql(f"SET {setting}")
                except Exception:  # an older server without the setting: go without it
                    connection.rollback()
            connection.execute(
                text("SELECT set_config('application_name', :name, false)"),
                {"name": f"kneepoint {self.id}"[:63]},
            )
            got = connection.execute(
                text("SELECT pg_try_advisory_lock(:kind, :key)"),
                {"kind": MEMBER_LOCKS, "key": member_key(self.id)},
            ).scalar()
            if not got:  # another id with the same hash: only its death goes unseen early
                log.warning("collector %s shares its lock key with another", self.id)
        except Exception as error:
            log.warning("collector %s cannot take its lock: %s", self.id, describe(error))
            connection.invalidate()
            connection.close()
            return None
        self._connection = connection
        return connection

    def _drop(self) -> None:
        """Close the dedicated connection for real (not back to the pool: that would keep
        its session-level locks), which releases every lock it held."""
        connection, self._connection, self._leading = self._connection, None, False
        if connection is None:
            return
        try:
            connection.invalidate()
            connection.close()
        except Exception as error:  # closed already: the locks went with it
            log.debug("closing the lock connection: %s", describe(error))
