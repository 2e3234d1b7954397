"""Microsoft Teams through a Workflows webhook: an Adaptive Card in a message attachment (the
old Office 365 connector cards no longer work)."""

from __future__ import annotations

from alerts.channels.base import Channel, Notice, Outgoing


class Teams(Channel):
    max_chars = 20000  # a card's payload tops out near 28 KB

    def request(self, notice: Notice, now: float) -> Outgoing:
        title, *rest = self.short(notice).split("\n")
        card = {
            "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
            "type": "AdaptiveCard",
            "version": "1.4",
            "body": [
                {"type": "TextBlock", "text": title, "weight": "Bolder", "wrap": True},
                *({"type": "TextBlock", "text": line, "wrap": True} for line in rest),
            ],
            "actions": [
                {"type": "Action.OpenUrl", "title": "Open in kneepoint", "url": notice.link}
            ],
        }
        body = {
            "type": "message",
            "attachments": [
                {"contentType": "application/vnd.microsoft.card.adaptive", "content": card}
            ],
        }
        return Outgoing(self.url, body, self.headers)
