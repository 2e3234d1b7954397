"""Chat and incident channels, one module each on a shared base (`base.Channel`)."""

from __future__ import annotations

from alerts.channels.alertmanager import Alertmanager
from alerts.channels.base import Channel, Notice, Outgoing
from alerts.channels.dingtalk import DingTalk
from alerts.channels.discord import Discord
from alerts.channels.feishu import Feishu
from alerts.channels.pagerduty import PagerDuty
from alerts.channels.slack import Slack
from alerts.channels.teams import Teams
from alerts.channels.telegram import Telegram
from alerts.channels.webhook import Webhook
from alerts.channels.wecom import WeCom
from kneepoint.config import Channel as ChannelConfig

KINDS: dict[str, type[Channel]] = {
    "slack": Slack,
    "discord": Discord,
    "teams": Teams,
    "feishu": Feishu,
    "dingtalk": DingTalk,
    "wecom": WeCom,
    "telegram": Telegram,
    "pagerduty": PagerDuty,
    "webhook": Webhook,
    "alertmanager": Alertmanager,
}


def channel(config: ChannelConfig) -> Channel:
    return KINDS[config.type](config)


__all__ = ["KINDS", "Channel", "Notice", "Outgoing", "channel"]
