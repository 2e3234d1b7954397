"""WeCom (企业微信) group robot: text messages of at most 2,048 bytes, 20 a minute."""

from __future__ import annotations

from alerts.channels.base import Channel, Notice, Outgoing


class WeCom(Channel):
    max_chars = 600  # 2,048 bytes of UTF-8, Chinese text at three bytes a character
    per_minute = 20

    def request(self, notice: Notice, now: float) -> Outgoing:
        body = {"msgtype": "text", "text": {"content": self.short(notice)}}
        return Outgoing(self.url, body, self.headers)
