"""PagerDuty Events API v2: trigger and resolve share the alert's fingerprint as dedup_key.

An alert that ended without a recovery (no longer measured: Notice.ended) is still sent as a
resolve, the only event that closes the incident, but with a payload whose summary says it
ended and why, and the why in custom_details.note, so the incident's log does not read as
fixed."""

from __future__ import annotations

from alerts.channels.base import Channel, Notice, Outgoing

EVENTS = "https://events.pagerduty.com/v2/enqueue"
SEVERITY = {"page": "critical", "ticket": "warning", "info": "info"}


class PagerDuty(Channel):
    max_chars = 1024  # payload.summary
    groups = False  # each alert is its own incident, keyed by its fingerprint

    def request(self, notice: Notice, now: float) -> Outgoing:
        if not self.config.routing_key:
            raise ValueError(f"channel {self.config.name!r} (pagerduty) needs a routing_key")
        body: dict[str, object] = {
            "routing_key": self.config.routing_key.reveal(),  # the platform needs it here
            "event_action": "resolve" if notice.status == "resolved" else "trigger",
            "dedup_key": notice.fingerprint,
        }
        if notice.status != "resolved":
            body["payload"] = {
                "summary": self.short(notice).split("\n")[0][: self.max_chars],
                "source": notice.replica or "fleet",
                "severity": SEVERITY.get(notice.severity, "warning"),
                "custom_details": {
                    "value": notice.value,
                    "threshold": notice.threshold,
                    **({"cause": notice.cause} if notice.cause else {}),
                    **({"changes": list(notice.changes)} if notice.changes else {}),
                },
            }
            body["links"] = [{"href": notice.link, "text": "kneepoint"}]
        elif notice.ended:
            body["payload"] = {
                "summary": f"{notice.title()}: {notice.ending()}"[: self.max_chars],
                "source": notice.replica or "fleet",
                "severity": SEVERITY.get(notice.severity, "warning"),
                "custom_details": {"note": notice.note},
            }
        url = self.config.url.reveal() if self.config.url else EVENTS
        return Outgoing(url, body, self.headers)
