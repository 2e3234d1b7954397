"""The production stack (docker-compose.yaml, Dockerfile, deploy/): no Docker engine runs
here, so its structure is checked, and what it mounts is validated by the real tools."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from kneepoint.cli import app
from kneepoint.config import load_config
from tests.conftest import require_real

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yaml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
PINNED = re.compile(r"^[\w./-]+:v?\d+(\.\d+)+[\w.-]*$")  # a version tag, never `latest`


def environment_example() -> dict[str, str]:
    lines = (ROOT / "deploy" / "env.example").read_text().splitlines()
    pairs = [line.split("=", 1) for line in lines if line and not line.startswith("#")]
    return {key: value for key, value in pairs}


def mounts(service: str) -> dict[str, str]:
    """Container path -> host path of a service's bind mounts."""
    found = {}
    for volume in SERVICES[service].get("volumes", []):
        source, target = volume.split(":")[:2]
        found[target] = source
    return found


def test_the_stack_has_every_service_and_each_image_is_pinned() -> None:
    assert set(SERVICES) == {
        "vllm",
        "dcgm-exporter",
        "kneepoint-collector",
        "kneepoint-app",
        "prometheus",
    }
    for name, service in SERVICES.items():
        assert PINNED.match(service["image"]), f"{name}: {service['image']} is not pinned"
        assert service["restart"] == "unless-stopped", name
        assert "healthcheck" in service and service["healthcheck"]["test"], (
            f"{name}: no health check"
        )
    assert SERVICES["prometheus"]["profiles"] == ["prometheus"], "Prometheus is optional"


def test_vllm_gets_the_gpus_prefix_caching_and_its_secrets_from_env() -> None:
    vllm = SERVICES["vllm"]
    assert vllm["image"].startswith("vllm/vllm-openai:")
    (device,) = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert "--enable-prefix-caching" in vllm["command"]
    assert "--port=8000" in vllm["command"] and "8000:8000" in vllm["ports"]
    assert any("${VLLM_API_KEY" in arg for arg in vllm["command"])
    assert vllm["env_file"][0]["path"] == ".env"
    assert "/health" in " ".join(vllm["healthcheck"]["test"])


def test_dcgm_exporter_has_the_gpus_and_the_profiling_fields() -> None:
    dcgm = SERVICES["dcgm-exporter"]
    assert "gpu" in dcgm["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"]
    assert "SYS_ADMIN" in dcgm["cap_add"]
    counters_in_container = dcgm["command"][dcgm["command"].index("-f") + 1]
    counters = (ROOT / mounts("dcgm-exporter")[counters_in_container]).read_text()
    fields = {
        line.split(",")[0].strip() for line in counters.splitlines() if line and line[0] != "#"
    }
    assert {
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_XID_ERRORS",
    } <= fields
    assert "9400:9400" in dcgm["ports"]


def test_collector_and_app_share_one_image_config_and_database_volume() -> None:
    collector, app = SERVICES["kneepoint-collector"], SERVICES["kneepoint-app"]
    assert collector["image"] == app["image"] and collector["build"] == app["build"] == "."
    assert collector["command"][:2] == ["kneepoint", "collect"]
    assert app["command"][:3] == ["kneepoint", "serve", "--no-collect"]
    assert "8501:8501" in app["ports"]
    assert collector["healthcheck"]["test"] == ["CMD", "kneepoint", "health"]
    for service in ("kneepoint-collector", "kneepoint-app"):
        volumes = mounts(service)
        assert volumes["/var/lib/kneepoint"] == "kneepoint-data", "the database is on a volume"
        assert volumes["/etc/kneepoint/kneepoint.yaml"] == "./deploy/kneepoint.yaml"
        assert SERVICES[service]["env_file"][0]["path"] == ".env"
    assert {"kneepoint-data", "prometheus-data"} <= set(COMPOSE["volumes"])


def test_the_mounted_config_validates_and_points_at_the_stack() -> None:
    config = load_config(ROOT / "deploy" / "kneepoint.yaml", environ=environment_example())
    assert config.database == "sqlite:////var/lib/kneepoint/kneepoint.db"
    urls = {target.kind: target.url for target in config.targets}
    assert urls == {"vllm": "http://vllm:8000/metrics", "dcgm": "http://dcgm-exporter:9400/metrics"}
    # The replica's GPU is found by the hostname dcgm-exporter is given.
    (replica,) = [t for t in config.targets if t.kind == "vllm"]
    host = environment_example()["GPU_HOST"]
    assert replica.gpus == [f"{host}/0"]
    assert SERVICES["dcgm-exporter"]["hostname"].startswith("${GPU_HOST")
    assert config.channels[0].url == environment_example()["SLACK_WEBHOOK_URL"]
    # The weekly review lands on the database's volume and goes to the on-call channel.
    assert config.report.output_dir.startswith("/var/lib/kneepoint/")
    assert config.report.channels == [config.channels[0].name]


def test_the_dockerfile_installs_the_package_and_runs_unprivileged() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    (base,) = re.findall(r"^FROM (\S+)", dockerfile, re.MULTILINE)
    assert PINNED.match(base), base
    for package in ("kneepoint", "collectors", "alerts", "dashboards", "app"):
        assert f"COPY {package} ./{package}" in dockerfile
    assert "pip install --no-cache-dir ." in dockerfile
    assert re.search(r"^USER kneepoint$", dockerfile, re.MULTILINE)


@pytest.mark.real
def test_promtool_accepts_the_stack_s_prometheus_config(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        require_real("no promtool (apt-get install prometheus; scripts/setup does it)")
    assert promtool is not None
    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    # The rules folder as the container mounts it: kneepoint's exported rules.
    rules_in_container = mounts("prometheus")["/etc/prometheus/rules"]
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    config["rule_files"] = [str(ROOT / rules_in_container / "*.yml")]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    checked = subprocess.run(
        [promtool, "check", "config", str(path)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout
    jobs = {
        job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]
    }
    assert jobs == {"vllm": ["vllm:8000"], "dcgm": ["dcgm-exporter:9400"]}


def test_the_stack_s_prometheus_rules_are_the_current_export(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key, value in environment_example().items():
        monkeypatch.setenv(key, value)
    exported = CliRunner().invoke(
        app, ["alerts", "export", "--config", str(ROOT / "deploy" / "kneepoint.yaml")]
    )
    assert exported.exit_code == 0, exported.output
    committed = (ROOT / "deploy" / "rules" / "kneepoint.yml").read_text()
    assert committed.split("\n", 1)[1] == exported.stdout, (
        "deploy/rules/kneepoint.yml is stale: rewrite it with the command on its first line"
    )
