"""Telegram Bot API `sendMessage` (text at most 4,096 characters)."""

from __future__ import annotations

from alerts.channels.base import Channel, Notice, Outgoing

API = "https://api.telegram.org"


class Telegram(Channel):
    max_chars = 4096

    def request(self, notice: Notice, now: float) -> Outgoing:
        if not self.config.token or not self.config.chat_id:
            raise ValueError(f"channel {self.config.name!r} (telegram) needs token and chat_id")
        base = (self.config.url.reveal() if self.config.url else API).rstrip("/")
        body = {"chat_id": self.config.chat_id, "text": self.short(notice)}
        token = self.config.token.reveal()  # in the path: the Bot API's own way
        return Outgoing(f"{base}/bot{token}/sendMessage", body, self.headers)
