"""A generic webhook carrying Alertmanager's v4 payload, optionally signed: the header
`X-Kneepoint-Signature: sha256=<hex HMAC-SHA256 of the body keyed with the secret>`.

Beyond Alertmanager's fields, the body has `note`: null, or why an alert ended without a
recovery (kneepoint can no longer measure it: the replica's engine does not expose the rule's
metric). Such an ending keeps `status: "resolved"` (the v4 payload knows only firing and
resolved, and receivers close the alert on it); the note says it is not a recovery, and each
such alert carries it in its `note` annotation too, its `summary` annotation saying so."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime

from alerts.channels.base import Channel, Notice, Outgoing

ZERO = "0001-01-01T00:00:00Z"  # Alertmanager's "no end yet"


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def alert_object(notice: Notice) -> dict[str, object]:
    """One alert as Alertmanager shows it to receivers (and takes it on /api/v2/alerts)."""
    labels = {
        "alertname": notice.rule,
        "replica": notice.replica or "fleet",
        "severity": notice.severity,
        **notice.labels,
    }
    annotations = {
        "summary": notice.text().split("\n")[1],
        "runbook": notice.runbook,
        "value": "" if notice.value is None else f"{notice.value:g}",
    }
    if notice.cause:
        annotations["cause"] = notice.cause
    if notice.changes:
        annotations["changes"] = "\n".join(notice.changes)
    if notice.ended:  # the summary (the line after the title) is the ending's why
        annotations["note"] = notice.note
    return {
        "status": notice.status,
        "labels": labels,
        "annotations": annotations,
        "startsAt": iso(notice.since),
        "endsAt": iso(notice.at) if notice.status == "resolved" else ZERO,
        "generatorURL": notice.link,
        "fingerprint": notice.fingerprint,
    }


def _common(sets: list[dict[str, str]]) -> dict[str, str]:
    """What every alert of the group shares."""
    return {k: v for k, v in sets[0].items() if all(other.get(k) == v for other in sets)}


class Webhook(Channel):
    max_chars = 20000

    def request(self, notice: Notice, now: float) -> Outgoing:
        alerts = [alert_object(one) for one in notice.split()]
        common = _common([dict(a["labels"]) for a in alerts])  # type: ignore[call-overload]
        notes = _common([dict(a["annotations"]) for a in alerts])  # type: ignore[call-overload]
        body = {
            "version": "4",
            "groupKey": notice.fingerprint,
            "truncatedAlerts": 0,
            "status": notice.status,
            "note": notice.note if notice.ended else None,  # not Alertmanager's: see above
            "receiver": self.config.name,
            "groupLabels": {"alertname": notice.rule},
            "commonLabels": common,
            "commonAnnotations": notes,
            "externalURL": notice.dashboard_url,
            "alerts": alerts,
        }
        content = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **self.headers}
        if self.config.secret:
            key = self.config.secret.reveal().encode()
            digest = hmac.new(key, content, hashlib.sha256).hexdigest()
            headers["X-Kneepoint-Signature"] = f"sha256={digest}"
        return Outgoing(self.url, body, headers, content)
