from __future__ import annotations

from pathlib import Path

import pytest

from kneepoint.config import ConfigError, load_config, parse_config
from tests.conftest import ROOT

BAD = {
    "an unknown top-level key": ("scrape_intervall: 15s", "scrape_intervall: is not a known key"),
    "an unknown target key": (
        "targets: [{name: a, kind: vllm, url: 'http://x/metrics', timout: 5s}]",
        "targets[0].timout: is not a known key",
    ),
    "a missing url": ("targets: [{name: a, kind: vllm}]", "targets[0].url: is required"),
    "a bad duration": ("scrape_interval: soon", "scrape_interval: 'soon' is not a duration"),
    "a bad kind": ("targets: [{name: a, kind: ollama, url: 'http://x/m'}]", "targets[0].kind"),
    "a url that is not http": ("targets: [{name: a, kind: vllm, url: 'x.y'}]", "targets[0].url"),
    "two targets with one name": (
        "targets: [{name: a, kind: vllm, url: 'http://x/m'}, {name: a, kind: dcgm, url: 'http://y/m'}]",
        "targets has two entries named 'a'",
    ),
    "a bad GPU reference": (
        "targets: [{name: a, kind: vllm, url: 'http://x/m', gpus: ['node']}]",
        "targets[0].gpus",
    ),
    "GPUs on a DCGM target": (
        "targets: [{name: a, kind: dcgm, url: 'http://x/m', gpus: ['n/0']}]",
        "targets[0].gpus is only for engine targets, not dcgm",
    ),
    "an SGLang target read through Prometheus": (
        "prometheus: {url: 'http://p:9090'}\ntargets: [{name: a, kind: sglang, url: 'http://x/m'}]",
        "targets[0].kind sglang cannot be read through prometheus:",
    ),
    "a rule naming an unknown channel": (
        "rules: [{name: r, metric: kv_cache_occupancy, op: '>', threshold: 0.9, channels: [x]}]",
        "rules[0].channels names unknown channel 'x'",
    ),
    "a bad comparison": ("rules: [{name: r, metric: m, op: '=>', threshold: 1}]", "rules[0].op"),
    "an objective of 100 %": (
        "slos: [{name: s, metric: ttft, threshold: 0.5s, objective: 1.0}]",
        "slos[0].objective",
    ),
    "a bad cron schedule": ("report: {schedule: 'every monday'}", "report.schedule"),
    "shrinking retention": ("retention: {raw: 40d}", "retention"),
    "a negative price": ("pricing: {gpu_hour: {default: -1}}", "pricing.gpu_hour.default"),
    "broken YAML": ("targets: [", "not valid YAML at line"),
    "a list at the top": ("- a\n- b", "the top level must be a mapping"),
}


@pytest.mark.parametrize(("text", "expected"), BAD.values(), ids=BAD.keys())
def test_a_bad_config_fails_with_one_sentence_naming_the_key(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(text, source="kneepoint.yaml", environ={})
    message = str(raised.value)
    assert message.startswith("kneepoint.yaml: ")
    assert expected in message
    assert "\n" not in message


def test_the_documented_example_is_valid() -> None:
    config = load_config(ROOT / "examples" / "kneepoint.yaml", environ={})
    assert {t.kind for t in config.targets} == {"vllm", "dcgm"}
    assert config.scrape_interval == 15
    assert config.retention.raw == 48 * 3600
    assert config.rules and config.slos and config.channels


def test_defaults_fill_what_the_file_leaves_out() -> None:
    config = parse_config("{}")
    assert config.database.reveal() == "sqlite:///kneepoint.db"
    assert config.scrape_interval == 15
    assert (config.retention.raw, config.retention.minute, config.retention.hour) == (
        48 * 3600,
        35 * 86400,
        400 * 86400,
    )
    assert config.report.schedule == "0 9 * * MON"


def test_variables_are_expanded_from_the_environment() -> None:
    text = """
targets:
  - name: a
    kind: vllm
    url: http://${HOST}:8000/metrics
    headers: {Authorization: "Bearer ${VLLM_API_KEY}"}
channels:
  - {name: c, type: slack, url: "${SLACK_URL:-http://127.0.0.1:9/hook}"}
"""
    config = parse_config(text, environ={"HOST": "10.0.0.11", "VLLM_API_KEY": "s3cret"})
    assert config.targets[0].url.reveal() == "http://10.0.0.11:8000/metrics"
    assert {k: v.reveal() for k, v in config.targets[0].headers.items()} == {
        "Authorization": "Bearer s3cret"
    }
    channel_url = config.channels[0].url
    assert channel_url is not None and channel_url.reveal() == "http://127.0.0.1:9/hook"


def test_an_unset_variable_names_the_key_and_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"channels\[0\].url uses \$\{HOOK\}, which is not set"):
        parse_config("channels: [{name: c, type: slack, url: '${HOOK}'}]", environ={})


def test_the_path_comes_from_the_flag_then_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen = tmp_path / "chosen.yaml"
    chosen.write_text("scrape_interval: 30s\n")
    other = tmp_path / "other.yaml"
    other.write_text("scrape_interval: 5s\n")
    monkeypatch.setenv("KNEEPOINT_CONFIG", str(other))
    assert load_config(chosen).scrape_interval == 30
    assert load_config().scrape_interval == 5


def test_a_missing_file_is_one_clear_sentence(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read config .*missing\.yaml"):
        load_config(tmp_path / "missing.yaml")
