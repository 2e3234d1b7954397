"""Which silences are broad (admin only in the app): those that name no alertname and no
replica but the fleet, since they would mute a whole class of alerts."""

from __future__ import annotations

import pytest

from alerts.silences import broad


@pytest.mark.parametrize(
    "matchers",
    [{"severity": "page"}, {"replica": "fleet"}, {"replica": "fleet", "severity": "page"}],
)
def test_broad(matchers: dict[str, str]) -> None:
    assert broad(matchers)


@pytest.mark.parametrize(
    "matchers",
    [
        {"alertname": "kv-cache-saturated"},
        {"replica": "qwen-a"},
        {"replica": "qwen-a", "severity": "page"},
        {"alertname": "ttft-burn", "replica": "fleet"},
    ],
)
def test_narrow(matchers: dict[str, str]) -> None:
    assert not broad(matchers)
