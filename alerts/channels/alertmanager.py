"""Forwarding to an existing Alertmanager: `POST /api/v2/alerts` with a list of alerts.

An alert that ended without a recovery (no longer measured: Notice.ended) is posted with its
`endsAt`, which is how Alertmanager learns it is over, and with the why in its `note` and
`summary` annotations (alerts/channels/webhook.py alert_object)."""

from __future__ import annotations

from alerts.channels.base import Channel, Notice, Outgoing
from alerts.channels.webhook import alert_object


class Alertmanager(Channel):
    max_chars = 20000

    def request(self, notice: Notice, now: float) -> Outgoing:
        posted = []
        for one in notice.split():
            alert = alert_object(one)
            entry = {k: alert[k] for k in ("labels", "annotations", "startsAt", "generatorURL")}
            if one.status == "resolved":
                entry["endsAt"] = alert["endsAt"]
            posted.append(entry)
        return Outgoing(f"{self.url.rstrip('/')}/api/v2/alerts", posted, self.headers)
