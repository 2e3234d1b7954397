"""Slack incoming webhook: `{"text": …}`."""

from __future__ import annotations

from alerts.channels.base import Channel, Notice, Outgoing


class Slack(Channel):
    max_chars = 3000  # a section's text limit

    def request(self, notice: Notice, now: float) -> Outgoing:
        return Outgoing(self.url, {"text": self.short(notice)}, self.headers)
