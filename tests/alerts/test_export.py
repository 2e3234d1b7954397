"""`kneepoint alerts export --format prometheus`, checked and run by Prometheus's own
promtool: the rules file is valid, and the exported KV-cache alert fires on vLLM series
exactly when kneepoint's rule would."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from kneepoint.cli import app
from tests.conftest import require_real

CONFIG = """
rules:
  - {name: slow-first-token, metric: ttft_p99_seconds, op: ">", threshold: 2, for: 1m,
     labels: {team: serving}}
"""


@pytest.fixture
def exported(tmp_path: Path) -> tuple[Path, str]:
    config = tmp_path / "kneepoint.yaml"
    config.write_text(f"database: sqlite:///{tmp_path / 'k.db'}\n" + CONFIG)
    result = CliRunner().invoke(
        app, ["alerts", "export", "--format", "prometheus", "--config", str(config)]
    )
    assert result.exit_code == 0, result.output
    text = result.stdout
    rules = tmp_path / "rules.yml"
    rules.write_text(text)
    return rules, result.stderr


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        require_real("no promtool (apt-get install prometheus)")
    return str(found)


def test_the_export_is_valid_prometheus_rules(exported: tuple[Path, str]) -> None:
    rules, stderr = exported
    groups = {g["name"]: g["rules"] for g in yaml.safe_load(rules.read_text())["groups"]}
    alerts = {r["alert"]: r for r in groups["kneepoint-alerts"]}
    assert alerts["kv-cache-saturated"]["expr"] == "kneepoint:kv_cache_occupancy > 0.9"
    assert alerts["kv-cache-saturated"]["for"] == "5m"
    assert alerts["slow-first-token"]["labels"] == {"severity": "ticket", "team": "serving"}
    assert "recompute-share-high: recompute_share_of_prefill has no PromQL form" in stderr
    assert "kv-cache-saturated: resolve_threshold 0.85 dropped" in stderr
    check = subprocess.run(
        [promtool(), "check", "rules", str(rules)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS" in check.stdout


def test_prometheus_fires_the_exported_kv_alert_after_five_minutes(
    exported: tuple[Path, str], tmp_path: Path
) -> None:
    rules, _ = exported
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                # 80 % for 3 minutes, then 95 % from minute 3 on.
                "input_series": [
                    {
                        "series": 'vllm:kv_cache_usage_perc{instance="qwen-a:8000"}',
                        "values": "0.8 0.8 0.8 0.95x10",
                    }
                ],
                "alert_rule_test": [
                    {"eval_time": "6m", "alertname": "kv-cache-saturated", "exp_alerts": []},
                    {
                        "eval_time": "9m",
                        "alertname": "kv-cache-saturated",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "page", "instance": "qwen-a:8000"},
                                "exp_annotations": {
                                    "summary": "kv_cache_occupancy > 0.9 on qwen-a:8000",
                                    "value": "0.95",
                                    "runbook": (
                                        "The next agent will wait: fp8 KV cache, a shorter "
                                        "max_model_len, or more replicas (see Capacity)."
                                    ),
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    spec = tmp_path / "test.yml"
    spec.write_text(yaml.safe_dump(test, sort_keys=False))
    run = subprocess.run([promtool(), "test", "rules", str(spec)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
