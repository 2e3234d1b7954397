"""Discord webhook: `{"content": …}`, at most 2,000 characters."""

from __future__ import annotations

from alerts.channels.base import Channel, Notice, Outgoing


class Discord(Channel):
    max_chars = 2000

    def request(self, notice: Notice, now: float) -> Outgoing:
        return Outgoing(self.url, {"content": self.short(notice)}, self.headers)
