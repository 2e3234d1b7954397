"""Everything the app changes, each behind the role it needs and recorded in the audit trail.

Each action establishes the session's identity itself (app/auth.current, on the server) and
checks the role before it writes: a hidden button is a convenience, this is the control.
A refused action raises kneepoint.auth.Refused with a sentence saying what it needs; a
page shows that sentence.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from alerts import outbox, silences
from app import auth, data
from kneepoint import audit
from kneepoint.auth import Refused
from kneepoint.durations import format_duration
from kneepoint.knee.imports import read_all
from kneepoint.knee.runs import Run
from kneepoint.store.runs import delete_run as remove_run
from kneepoint.store.runs import save_run
from kneepoint.whatif import Profile, calibrate_replica, save_profile
from review.deliver import send_report as deliver
from review.effects import number

UPLOAD_SUFFIXES = (".json", ".jsonl")


def parse_matchers(text: str) -> dict[str, str]:
    """Matchers as typed: "alertname=kv-cache-saturated, replica=qwen-a"."""
    pairs = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ValueError(f"matcher {part.strip()!r} is not label=value")
        pairs[name.strip()] = value.strip()
    return pairs


def create_silence(matchers: str, hours: float, comment: str) -> int:
    """A silence by the signed-in person (its author), under the silence policy: a comment,
    at most `limits.silence_max`, and admin for one that names no alertname and no replica."""
    config, sessions = data.store()
    who = auth.current()
    now = time.time()
    pairs = parse_matchers(matchers)
    seconds = hours * 3600.0
    subject = ", ".join(f"{k}={v}" for k, v in pairs.items())
    with audit.mutation(sessions.begin, who, "operator", "silence.create", subject, now) as (
        session,
        change,
    ):
        # Policy refusals (Refused, not ValueError): recorded as refused, not as failed.
        if not comment.strip():
            raise Refused("a silence needs a comment: why, and until what")
        if seconds > config.limits.silence_max:
            limit = format_duration(config.limits.silence_max)
            raise Refused(f"a silence may last at most {limit} (limits.silence_max)")
        if silences.broad(pairs) and not who.can("admin"):
            raise Refused(
                "A silence that names no alertname and no replica mutes a whole class of "
                f"alerts and needs the admin role; {who.name} has the {who.role} role."
            )
        number = silences.create(session, pairs, now, now + seconds, who.name, comment, now)
        change.subject = f"silence {number}"
        change.after = {"matchers": pairs, "ends_at": now + seconds, "comment": comment}
    return number


def expire_silence(silence_id: int) -> bool:
    _, sessions = data.store()
    who = auth.current()
    now = time.time()
    subject = f"silence {silence_id}"
    with audit.mutation(sessions.begin, who, "operator", "silence.expire", subject, now) as (
        session,
        change,
    ):
        before = silences.get(session, silence_id)
        expired = silences.expire(session, silence_id, now)
        if before is not None:
            change.before = {"matchers": before.matchers, "ends_at": before.ends_at}
            change.after = {"ends_at": max(now, before.starts_at)} if expired else None
    return expired


def send_test(channel_name: str) -> str:
    """A test message to one configured channel (never to a URL typed into a page)."""
    config, sessions = data.store()
    who = auth.current()
    now = time.time()
    subject = f"channel {channel_name}"
    with audit.mutation(sessions.begin, who, "operator", "channel.test", subject, now) as (
        _,
        change,
    ):
        state, error = outbox.send_trial(sessions, config, channel_name, now)
        change.after = {"state": state}
    data.clear_deliveries()
    if state == "sent":
        return "Delivered."
    if state == "pending":
        return f"Not delivered yet; it will be retried ({error})."
    return f"Refused: {error}"


def import_results(files: list[tuple[str, bytes]]) -> tuple[list[Run], list[str]]:
    """Import uploaded result files (name, content): the runs stored, and one sentence per
    file refused (too big, not JSON, or not a known format; nothing of it is stored)."""
    config, sessions = data.store()
    who = auth.current()
    now = time.time()
    limit = int(config.limits.upload_mb * 1024 * 1024)
    refused: list[str] = []
    accepted: list[tuple[str, bytes]] = []
    for name, content in files:
        if not name.lower().endswith(UPLOAD_SUFFIXES):
            refused.append(f"{name}: not a .json or .jsonl file")
        elif len(content) > limit:
            refused.append(f"{name}: larger than limits.upload_mb ({config.limits.upload_mb:g} MB)")
        else:
            accepted.append((name, content))
    subject = ", ".join(name for name, _ in files)[:200]
    with audit.mutation(sessions.begin, who, "operator", "run.import", subject, now) as (
        session,
        change,
    ):
        with tempfile.TemporaryDirectory() as folder:
            paths: list[str | Path] = []
            for name, content in accepted:
                path = Path(folder) / Path(name).name
                path.write_bytes(content)
                paths.append(path)
            merged, unreadable = read_all(paths) if paths else ([], [])
        for run in merged:
            save_run(session, run, now)
        refused += unreadable
        change.after = {"stored": [run.label for run in merged], "refused": refused}
    data.clear_runs()
    return merged, refused


def delete_run(label: str) -> int:
    _, sessions = data.store()
    who = auth.current()
    now = time.time()
    with audit.mutation(sessions.begin, who, "operator", "run.delete", f"run {label}", now) as (
        session,
        change,
    ):
        gone = remove_run(session, label)
        change.before = {"label": label, "rows": gone}
    data.clear_runs()
    return gone


def send_report() -> str:
    """Write this week's review now and queue its summary for the report channels."""
    config, sessions = data.store()
    who = auth.current()
    now = time.time()
    with audit.mutation(sessions.begin, who, "operator", "report.send", "weekly review", now) as (
        session,
        change,
    ):
        page, queued = deliver(session, config, now)
        change.after = {"file": page.name, "messages": queued}
    return f"Written to {page.name}; {queued} message(s) queued for the report channels."


def calibrate(replica: str, run_label: str | None, start: float, end: float) -> Profile:
    """Fit the twin to `replica` (its knee run and the window's history) and store the
    calibration: operator, audited with the fit's trust and error."""
    config, sessions = data.store()
    who = auth.current()
    now = time.time()
    subject = f"replica {replica}"
    with audit.mutation(sessions.begin, who, "operator", "whatif.calibrate", subject, now) as (
        session,
        change,
    ):
        profile = calibrate_replica(session, config, replica, run_label, start, end, now)
        save_profile(session, profile)
        change.after = {
            "run": profile.run_label,
            "trusted": profile.fit.trusted,
            "rms_relative_error": number(profile.fit.rms),
        }
    return profile
