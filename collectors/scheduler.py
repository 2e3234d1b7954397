"""APScheduler 3's schedulers, made safe against the wall clock stepping back.

APScheduler 3 keeps each job's next run as a wall-clock time. When the clock steps back
(NTP correcting a drifted host, a VM restored from a snapshot), an interval job whose next
run was 15 s away is suddenly an hour away, and scraping, evaluation and delivery stall for
that hour. An interval job's next run is never legitimately more than one interval ahead,
so whenever one is (by more than a little slack), it is pulled back to now.
"""

from __future__ import annotations

import gc
import logging
from datetime import datetime, timedelta
from typing import Any

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, JobEvent
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.interval import IntervalTrigger

from kneepoint.malloc import cap_arenas

log = logging.getLogger(__name__)
SLACK = timedelta(seconds=1)


def pull_back_stepped_jobs(scheduler: BaseScheduler, now: datetime) -> list[str]:
    """Move every interval job that is more than one interval away to `now`; return their
    ids."""
    moved = []
    for job in scheduler.get_jobs():
        trigger, due = job.trigger, job.next_run_time
        if not isinstance(trigger, IntervalTrigger) or due is None:
            continue
        if due - now > trigger.interval + SLACK:
            job.modify(next_run_time=now)
            moved.append(job.id)
    if moved:
        log.warning("the clock stepped back: jobs %s run now", ", ".join(moved))
    return moved


class _StepSafe:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Every collector (`kneepoint collect`, `serve`, the demo `./scripts/run` starts)
        # makes one of these before any job thread: cap malloc's arenas now, so its memory
        # stays flat however it was launched, not only in the image (kneepoint/malloc.py).
        cap_arenas()
        super().__init__(*args, **kwargs)

    def _process_jobs(self) -> Any:
        scheduler: BaseScheduler = self  # type: ignore[assignment]
        pull_back_stepped_jobs(scheduler, datetime.now(scheduler.timezone))
        return super()._process_jobs()  # type: ignore[misc]


class StepSafeBlockingScheduler(_StepSafe, BlockingScheduler):
    """`kneepoint collect`'s scheduler. After each job's first run (when what it imports and
    builds once, pandas, SQLAlchemy's compiled statements, the rules, is made), what the
    process holds is collected once and then frozen (gc.freeze): Python's full collections
    walk every tracked object, and nearly all of the collector's are such start-up objects
    that live for good: at 500 targets generation 2 took 7-8 % of the collector's CPU
    (bench/bench_prometheus.py). Later collections walk what was made since. An object
    frozen that later becomes cyclic garbage is never freed: the collection before each
    freeze leaves none that is already garbage, and only start-up's objects are frozen."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._settled: set[str] = set()
        self.add_listener(self._settle, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR)

    def _settle(self, event: JobEvent) -> None:
        if event.job_id in self._settled:
            return
        self._settled.add(event.job_id)
        settle()


def settle() -> None:
    """Collect what is garbage now, then freeze the rest out of later collections."""
    gc.collect()
    gc.freeze()


class StepSafeBackgroundScheduler(_StepSafe, BackgroundScheduler):
    """`kneepoint serve`'s and the demo's scheduler."""
