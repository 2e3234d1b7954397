"""The image, built without Docker: exactly the files the Dockerfile's COPY lines (less
.dockerignore) put where its `pip install .` runs, installed (not editable) into a fresh
venv, and run from another folder the way the image's CMD runs; then every page opened in
Chromium, `kneepoint health` and the app container's health check run against it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.registry import PAGES
from tests.conftest import (
    DCGM_T4,
    ROOT,
    VLLM_032,
    Route,
    free_port,
    serving_metrics,
    wait_until_healthy,
)
from tests.dockerfile import Image, build_context, included_packages
from tests.real.test_browser import ERROR_BOXES, browser
from tests.seed import seed

__all__ = ["browser"]  # the Chromium fixture, shared with the browser test

pytestmark = [pytest.mark.real, pytest.mark.timeout(400)]

# The app's script has finished its run (Streamlit marks its root element so).
SCRIPT_DONE = (
    '[data-testid="stApp"][data-test-script-state="notRunning"], '
    '[data-testid="stApp"][data-test-script-state="compilationError"]'
)
# Modules that are scripts, not importable libraries: Streamlit runs them.
SCRIPTS = ("app.main",)


@dataclass(frozen=True)
class Installed:
    image: Image
    python: Path
    site_packages: Path
    workdir: Path  # not the checkout: nothing can import from it
    env: dict[str, str]  # the venv first on PATH, nothing pointing at the checkout

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("image")
    context, venv, workdir = base / "context", base / "venv", base / "workdir"
    context.mkdir()
    workdir.mkdir()
    image = build_context(ROOT, context)
    # A fresh venv without pip of its own (ensurepip costs seconds): this test's pip installs
    # into it (`pip --python`).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    env = {
        key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    # Like the Dockerfile's `pip install .`: not editable, from the copied tree, resolving
    # every dependency. Unlike it, pip's cache and wheel sources stay in use (the image is
    # built once; this runs on every CI run) and no bytecode is compiled, to keep it quick.
    began = time.monotonic()
    install = ["install", "--quiet", "--no-compile", str(context)]
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), *install],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(f"\nclean install of the image's context: {time.monotonic() - began:.1f} s")
    assert pip.returncode == 0, pip.stderr[-3000:]
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return Installed(image, python, Path(site).resolve(), workdir, env)


def test_every_package_comes_from_the_install_not_the_checkout(installed: Installed) -> None:
    packages = included_packages(ROOT)
    assert {"kneepoint", "app", "review"} <= set(packages)
    shown = installed.run(
        str(installed.python),
        "-c",
        "import importlib.util, sys\n"
        "for name in sys.argv[1:]:\n"
        "    spec = importlib.util.find_spec(name)\n"
        "    print(name, spec and spec.origin)\n",
        *packages,
    )
    assert shown.returncode == 0, shown.stderr
    origins = dict(line.split(" ", 1) for line in shown.stdout.splitlines())
    for name in packages:
        origin = origins[name]
        assert origin != "None", f"{name} is not installed by the image"
        assert Path(origin).resolve().is_relative_to(installed.site_packages), origin
    assert Path(origins["kneepoint"]).parent == installed.site_packages / "kneepoint"
    assert not installed.site_packages.is_relative_to(ROOT)
    # `kneepoint` on the CMD's PATH is the venv's console script.
    command = shutil.which("kneepoint", path=installed.env["PATH"])
    assert command is not None and Path(command) == installed.python.parent / "kneepoint"


def test_every_installed_module_imports(installed: Installed) -> None:
    """Each module of each package imports in the image's environment: its third-party
    imports are dependencies and its first-party ones are installed."""
    walked = installed.run(
        str(installed.python),
        "-c",
        "import importlib, pkgutil, sys\n"
        "scripts = set(sys.argv[1].split(','))\n"
        "for top in sys.argv[2:]:\n"
        "    package = importlib.import_module(top)\n"
        "    print(top, package.__file__)\n"
        "    for info in pkgutil.walk_packages(package.__path__, top + '.'):\n"
        "        if info.name not in scripts:\n"
        "            print(info.name, importlib.import_module(info.name).__file__)\n",
        ",".join(SCRIPTS),
        *included_packages(ROOT),
        timeout=180,
    )
    assert walked.returncode == 0, walked.stderr[-3000:]
    imported = dict(line.split(" ", 1) for line in walked.stdout.splitlines())
    assert {"app.data", "review.weekly", "collectors.collect", "kneepoint.cli"} <= set(imported)
    outside = [
        f
        for f in imported.values()
        if not Path(f).resolve().is_relative_to(installed.site_packages)
    ]
    assert not outside, outside


@pytest.fixture(scope="module")
def served(installed: Installed) -> Iterator[tuple[str, dict[str, str]]]:
    """The image's CMD (`kneepoint serve`, collecting) with a port, on a seeded store whose
    targets answer on loopback; yields the app's URL and the environment it runs with."""
    with serving_metrics() as targets:
        targets.routes = {
            "/a": Route(VLLM_032.read_bytes()),
            "/b": Route(VLLM_032.read_bytes()),
            "/gpus": Route(DCGM_T4.read_bytes()),
            "/down": Route(b"upstream unavailable", status=503),
        }
        config = seed(installed.workdir, time.time(), base_url=targets.url(""))
        # The image reads its config from $KNEEPOINT_CONFIG (the compose file mounts it).
        assert "KNEEPOINT_CONFIG" in installed.image.env
        env = {**installed.env, "KNEEPOINT_CONFIG": str(config)}
        assert installed.image.cmd[:2] == ["kneepoint", "serve"], installed.image.cmd
        port = free_port()
        log = installed.workdir / "serve.log"
        with log.open("w") as sink:
            process = subprocess.Popen(
                [*installed.image.cmd, "--port", str(port)],
                cwd=installed.workdir,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_healthy(process, f"{url}/_stcore/health", 90, log.read_text)
            yield url, env
        finally:
            process.terminate()
            process.wait(timeout=30)


@pytest.mark.parametrize("spec", PAGES, ids=lambda spec: spec.url_path)
def test_each_page_of_the_installed_app_opens_without_an_error(browser, served, spec) -> None:  # type: ignore[no-untyped-def]
    url, _ = served
    path = "" if spec == PAGES[0] else spec.url_path
    page = browser.new_page()
    try:
        page.goto(f"{url}/{path}")
        page.wait_for_selector(SCRIPT_DONE, state="attached", timeout=90_000)
        errors = page.locator(ERROR_BOXES)
        assert errors.count() == 0, errors.all_inner_texts()
        assert page.get_by_text("Page not found").count() == 0
        assert page.locator("h1").first.inner_text().strip() == spec.title
    finally:
        page.close()


def test_kneepoint_health_is_healthy_once_the_image_has_scraped(
    installed: Installed, served: tuple[str, dict[str, str]]
) -> None:
    _, env = served
    deadline = time.monotonic() + 60
    while True:
        checked = subprocess.run(
            ["kneepoint", "health"],
            cwd=installed.workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if checked.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)  # a poll: the first scrape round lands within a scrape interval
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "scrape" in checked.stdout  # it read the image's own scrape job


def test_the_app_container_health_check_passes(
    installed: Installed, served: tuple[str, dict[str, str]]
) -> None:
    url, env = served
    checked = subprocess.run(
        [str(installed.python), str(ROOT / "deploy" / "app_health.py"), url],
        cwd=installed.workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.strip() == "healthy"
