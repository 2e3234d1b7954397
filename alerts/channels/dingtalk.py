"""DingTalk custom robot. Signed: `timestamp` (milliseconds) and `sign` in the URL, where sign
is Base64 of HMAC-SHA256 keyed with the secret over `timestamp + "\n" + secret`, then
URL-encoded. About 20 messages a minute per robot."""

from __future__ import annotations

import base64
import hashlib
import hmac
from urllib.parse import quote_plus

from alerts.channels.base import Channel, Notice, Outgoing


def dingtalk_sign(timestamp_ms: int, secret: str) -> str:
    message = f"{timestamp_ms}\n{secret}".encode()
    digest = hmac.new(secret.encode(), message, hashlib.sha256).digest()
    return quote_plus(base64.b64encode(digest).decode())


class DingTalk(Channel):
    max_chars = 4000
    per_minute = 20

    def request(self, notice: Notice, now: float) -> Outgoing:
        url = self.url
        if self.config.secret:
            stamp = int(now * 1000)
            joiner = "&" if "?" in url else "?"
            sign = dingtalk_sign(stamp, self.config.secret.reveal())
            url = f"{url}{joiner}timestamp={stamp}&sign={sign}"
        body = {"msgtype": "text", "text": {"content": self.short(notice)}}
        return Outgoing(url, body, self.headers)
