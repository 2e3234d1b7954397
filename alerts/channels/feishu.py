"""Feishu / Lark custom bot. Signed: `timestamp` (seconds) and `sign` in the body, where sign
is Base64 of HMAC-SHA256 keyed with `timestamp + "\n" + secret` over an empty message."""

from __future__ import annotations

import base64
import hashlib
import hmac

from alerts.channels.base import Channel, Notice, Outgoing


def feishu_sign(timestamp: int, secret: str) -> str:
    key = f"{timestamp}\n{secret}".encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


class Feishu(Channel):
    max_chars = 4000

    def request(self, notice: Notice, now: float) -> Outgoing:
        body: dict[str, object] = {"msg_type": "text", "content": {"text": self.short(notice)}}
        if self.config.secret:
            timestamp = int(now)
            body = {
                "timestamp": str(timestamp),
                "sign": feishu_sign(timestamp, self.config.secret.reveal()),
                **body,
            }
        return Outgoing(self.url, body, self.headers)
