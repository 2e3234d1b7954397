"""The production stack (docker-compose.yaml, Dockerfile, deploy/): no Docker engine runs
here, so its structure is checked, and what it mounts is validated by the real tools."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from kneepoint.cli import app
from kneepoint.config import load_config
from tests.conftest import MetricsServer, Route, require_real
from tests.dockerfile import Ignore, context_files, included_packages, install_tree, parse

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
        "kneepoint-migrate",
        "kneepoint-collector",
        "kneepoint-app",
        "prometheus",
    }
    for name, service in SERVICES.items():
        assert PINNED.match(service["image"]), f"{name}: {service['image']} is not pinned"
        if name == "kneepoint-migrate":  # a one-shot: it runs to completion, then the rest
            assert service["restart"] == "no" and service["command"] == ["kneepoint", "migrate"]
            continue
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
    assert app["ports"] == ["127.0.0.1:8501:8501"]  # published on the host's loopback only
    assert collector["healthcheck"]["test"] == ["CMD", "kneepoint", "health"]
    for service in (collector, app):  # neither migrates: the migrate service has, before
        assert service["depends_on"]["kneepoint-migrate"] == {
            "condition": "service_completed_successfully"
        }
    for service in ("kneepoint-collector", "kneepoint-app"):
        volumes = mounts(service)
        assert volumes["/var/lib/kneepoint"] == "kneepoint-data", "the database is on a volume"
        assert volumes["/etc/kneepoint/kneepoint.yaml"] == "./deploy/kneepoint.yaml"
        assert SERVICES[service]["env_file"][0]["path"] == ".env"
    assert {"kneepoint-data", "prometheus-data"} <= set(COMPOSE["volumes"])


def test_the_mounted_config_validates_and_points_at_the_stack() -> None:
    config = load_config(ROOT / "deploy" / "kneepoint.yaml", environ=environment_example())
    assert config.database.reveal() == "sqlite:////var/lib/kneepoint/kneepoint.db"
    urls = {target.kind: target.url.reveal() for target in config.targets}
    assert urls == {"vllm": "http://vllm:8000/metrics", "dcgm": "http://dcgm-exporter:9400/metrics"}
    # The replica's GPU is found by the hostname dcgm-exporter is given.
    (replica,) = [t for t in config.targets if t.kind == "vllm"]
    host = environment_example()["GPU_HOST"]
    assert replica.gpus == [f"{host}/0"]
    assert SERVICES["dcgm-exporter"]["hostname"].startswith("${GPU_HOST")
    hook = config.channels[0].url
    assert hook is not None and hook.reveal() == environment_example()["SLACK_WEBHOOK_URL"]
    # The weekly review lands on the database's volume and goes to the on-call channel.
    assert config.report.output_dir.startswith("/var/lib/kneepoint/")
    assert config.report.channels == [config.channels[0].name]


def test_the_app_listens_in_its_container_with_explicit_auth_and_only_on_host_loopback() -> None:
    """The container's loopback is not the host's: the app listens on 0.0.0.0 in it, which
    kneepoint allows only with `auth:` set, and the port is published on 127.0.0.1."""
    from kneepoint.auth import listen_problem

    command = SERVICES["kneepoint-app"]["command"]
    host = command[command.index("--host") + 1]
    port = command[command.index("--port") + 1]
    assert host == "0.0.0.0"
    (published,) = SERVICES["kneepoint-app"]["ports"]
    assert published.split(":") == ["127.0.0.1", port, port]
    config = load_config(ROOT / "deploy" / "kneepoint.yaml", environ=environment_example())
    assert config.auth is not None and config.auth.mode == "none"
    assert config.auth.anonymous_role == "viewer"  # read only until sign-in is set up
    assert listen_problem(host, config.auth) is None
    assert listen_problem(host, None) is not None  # without the explicit auth: it would not start
    comment = (ROOT / "deploy" / "kneepoint.yaml").read_text()
    assert "mode: proxy" in comment and "mode: oidc" in comment and "beyond loopback" in comment


IMAGE = parse((ROOT / "Dockerfile").read_text())


def test_the_dockerfile_installs_the_project_and_runs_unprivileged() -> None:
    assert PINNED.match(IMAGE.base), IMAGE.base
    assert IMAGE.install_dirs == ["/opt/kneepoint"], "one `pip install .` of the copied tree"
    assert "pip install --no-cache-dir ." in (ROOT / "Dockerfile").read_text()
    assert IMAGE.user == "kneepoint"
    assert IMAGE.workdir == "/var/lib/kneepoint"  # the data volume, not the source tree
    assert IMAGE.cmd[:2] == ["kneepoint", "serve"]


def test_every_package_pyproject_includes_is_in_what_the_image_installs() -> None:
    """Each file of each package setuptools' packages.find includes reaches the folder the
    image's `pip install .` runs in (the COPY lines, less .dockerignore)."""
    tree = install_tree(ROOT, IMAGE)
    packages = included_packages(ROOT)
    assert {"kneepoint", "collectors", "alerts", "dashboards", "app", "review"} <= set(packages)
    assert {"pyproject.toml", "README.md"} <= set(tree), "the metadata pip builds from"
    for package in packages:
        for path in (ROOT / package).rglob("*"):
            relative = path.relative_to(ROOT).as_posix()
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                assert relative in tree, f"{relative} is not in the image"
    # And none of the checkout's tests, tools, environment, history or secrets.
    tops = {path.split("/")[0] for path in tree}
    assert not tops & {"tests", "bench", "scripts", "deploy", "examples", ".git", ".venv"}
    secrets = [p for p in tree if Path(p).name == ".env" or Path(p).suffix.startswith(".db")]
    assert not secrets, secrets


def test_every_first_party_import_is_an_installed_package() -> None:
    """A module of an installed package importing a top-level folder of the checkout that is
    not installed (tests, bench, a new package left out of pyproject) would fail in the
    image; every such import must name an included package."""
    packages = set(included_packages(ROOT))
    first_party = {p.name for p in ROOT.iterdir() if p.is_dir() and p.name.isidentifier()}
    first_party |= {p.stem for p in ROOT.glob("*.py")}
    imported: dict[str, str] = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    imported.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    assert "review" in imported  # the import that once went missing (app/data.py)
    missing = {top: where for top, where in imported.items() if top in first_party - packages}
    assert not missing, f"imported but not installed: {missing}"


def test_dockerignore_keeps_secrets_state_and_tests_out_of_the_context(
    tmp_path: Path,
) -> None:
    (tmp_path / ".dockerignore").write_text((ROOT / ".dockerignore").read_text())
    for relative in (
        ".env",
        ".git/config",
        ".venv/bin/python",
        "kneepoint.db",
        "deep/down/kneepoint.db-wal",
        "kneepoint/__pycache__/cli.cpython-311.pyc",
        "kneepoint.egg-info/PKG-INFO",
        "tests/test_x.py",
        "reports/weekly.html",
        "sub/.env",
        "newpackage/__init__.py",
        "kneepoint/store/db.py",
        "pyproject.toml",
    ):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("x")
    assert context_files(tmp_path) == [
        "kneepoint/store/db.py",
        "newpackage/__init__.py",
        "pyproject.toml",
    ]


@pytest.mark.parametrize(
    ("patterns", "path", "excluded"),
    [
        ("**/*.db", "a/b/c.db", True),
        ("**/*.db", "c.db", True),
        ("*.db", "a/c.db", False),  # `*` stays within one folder
        ("docs\n!docs/keep.md", "docs/keep.md", False),  # the last matching pattern wins
        ("docs\n!docs/keep.md", "docs/other.md", True),
        ("build", "build/lib/x.py", True),  # a folder excludes what is under it
        ("/build", "build/x", True),
        ("b?ild", "build", True),
    ],
)
def test_dockerignore_patterns_follow_docker_s_rules(
    tmp_path: Path, patterns: str, path: str, excluded: bool
) -> None:
    (tmp_path / ".dockerignore").write_text(patterns)
    assert Ignore.read(tmp_path).excludes(path) is excluded


def test_the_dockerfile_parser_places_copies_as_docker_does() -> None:
    image = parse(
        "FROM python:3.11\nWORKDIR /opt/x\nCOPY pyproject.toml README.md ./\n"
        "COPY kneepoint ./kneepoint\nRUN pip install \\\n    --no-cache-dir . && true\n"
        'WORKDIR /data\nCMD ["kneepoint", "serve"]\n'
    )
    assert image.install_dirs == ["/opt/x"] and image.workdir == "/data"
    tree = install_tree(ROOT, image)
    assert tree["pyproject.toml"] == "pyproject.toml"
    assert tree["kneepoint/cli.py"] == "kneepoint/cli.py"
    assert not any(path.startswith(("app/", "review/")) for path in tree)
    with pytest.raises(ValueError, match="multi-stage"):
        parse("FROM a:1 AS build\nFROM b:2\n")


def test_the_app_health_check_runs_the_pages_imports_not_only_the_server() -> None:
    """Streamlit's /_stcore/health stays green while every page fails to import; the app's
    check also imports what the pages import (deploy/app_health.py, mounted)."""
    app_service = SERVICES["kneepoint-app"]
    test = app_service["healthcheck"]["test"]
    assert test[:2] == ["CMD", "python"] and "_stcore/health" not in " ".join(test)
    script = test[2]
    assert mounts("kneepoint-app")[script] == "./deploy/app_health.py"
    assert (ROOT / "deploy" / "app_health.py").is_file()
    port = app_service["command"][app_service["command"].index("--port") + 1]
    assert test[3:] == [f"http://127.0.0.1:{port}"]


def run_app_health(url: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "app_health.py"), url],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT / "deploy",
    )


def test_the_app_health_check_passes_on_a_serving_app_with_every_import(
    metrics_server: MetricsServer,
) -> None:
    metrics_server.routes["/_stcore/health"] = Route(b"ok")
    checked = run_app_health(metrics_server.url(""))
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.strip() == "healthy"
    assert metrics_server.hits["/_stcore/health"] == 1


def test_the_app_health_check_fails_when_the_server_does_not_answer(
    metrics_server: MetricsServer,
) -> None:
    metrics_server.routes["/_stcore/health"] = Route(b"starting", status=503)
    checked = run_app_health(metrics_server.url(""))
    assert checked.returncode == 1
    assert "does not answer" in checked.stderr and "503" in checked.stderr


def test_the_app_health_check_fails_when_a_page_cannot_import(
    metrics_server: MetricsServer, tmp_path: Path
) -> None:
    """An installed app whose pages import a package the image lacks: the server answers,
    the check does not pass."""
    metrics_server.routes["/_stcore/health"] = Route(b"ok")
    (tmp_path / "app" / "screens").mkdir(parents=True)
    (tmp_path / "app" / "__init__.py").write_text("")
    (tmp_path / "app" / "main.py").write_text("from app import data\n")
    (tmp_path / "app" / "data.py").write_text("import json\n")
    (tmp_path / "app" / "screens" / "weekly.py").write_text(
        "from missing_package.render import html\n"
    )
    checked = run_app_health(metrics_server.url(""), pythonpath=tmp_path)
    assert checked.returncode == 1
    assert "No module named 'missing_package'" in checked.stderr, checked.stderr


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
