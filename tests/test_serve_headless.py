"""`kneepoint serve` starts wherever it is started: on a machine where Streamlit never ran
(a fresh HOME, no ~/.streamlit), with no terminal (stdin /dev/null, a session of its own:
systemd, nohup, CI), with and without --no-browser. The app answers, nothing Streamlit says
to a person (its e-mail prompt, its banner, its usage-statistics line) reaches the output,
and the browser is opened (through $BROWSER, here a script that writes down the URL) only
without --no-browser, at the app's address."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port, wait_until_healthy
from tests.seed import seed

# What Streamlit prints to a person when it is not headless, or not told to be quiet.
STREAMLIT_TALK = (
    "Welcome to Streamlit",
    "Email",
    "gatherUsageStats",
    "usage statistics",
    "You can now view your Streamlit app",
    "Local URL",
    "streamlit skills",
)


@pytest.mark.parametrize("no_browser", [True, False], ids=["--no-browser", "browser"])
def test_serve_starts_headless_without_a_terminal_or_streamlit_credentials(
    tmp_path: Path, no_browser: bool
) -> None:
    home = tmp_path / "home"
    home.mkdir()  # empty: no .streamlit/credentials.toml, as on a new machine
    opened = tmp_path / "opened"
    opener = tmp_path / "opener"
    opener.write_text(f'#!/bin/sh\necho "$1" >> {opened}\n')
    opener.chmod(0o755)
    config = seed(tmp_path, time.time(), minutes=1)
    port = free_port()
    log = tmp_path / "serve.log"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("STREAMLIT_")  # nothing set from outside quiets it instead
    }
    env.update(HOME=str(home), BROWSER=str(opener), PYTHONUNBUFFERED="1")
    env.pop("DISPLAY", None)
    env.pop("WAYLAND_DISPLAY", None)
    command = [sys.executable, "-m", "kneepoint.cli", "serve", "--port", str(port)]
    command += ["--config", str(config)] + (["--no-browser"] if no_browser else [])
    with log.open("w") as output:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
            start_new_session=True,  # no controlling terminal
        )
    try:
        wait_until_healthy(process, f"http://127.0.0.1:{port}/_stcore/health", 90, log.read_text)
        if not no_browser:  # opened once the app answered: wait for the script to run
            deadline = time.monotonic() + 30
            while not opened.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
    finally:
        process.terminate()
        status = process.wait(timeout=30)
    said = log.read_text()
    assert status == 0, said[-3000:]
    for words in STREAMLIT_TALK:
        assert words not in said, f"{words!r} in the output of serve:\n{said[-3000:]}"
    assert f"app on http://localhost:{port}" in said, said[-3000:]
    assert not (home / ".streamlit" / "credentials.toml").exists()
    if no_browser:
        assert not opened.exists()
    else:
        assert opened.read_text().split() == [f"http://localhost:{port}"]


@pytest.mark.parametrize("open_browser", [True, False])
def test_the_demo_and_serve_start_streamlit_headless_and_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, open_browser: bool
) -> None:
    """`kneepoint demo` starts the app through the same `app_process` as serve (its week of
    backfill makes a real start too slow here): headless, no e-mail prompt, no usage
    statistics, no banner, whether or not a browser is wanted."""
    from kneepoint import webapp
    from kneepoint.config import load_config

    started: list[list[str]] = []

    class Recorded:
        def __init__(self, command: list[str], **options: object) -> None:
            started.append(command)
            assert options["stdin"] == subprocess.DEVNULL  # it can never read a terminal

        def poll(self) -> int:
            return 0  # "exited": the browser thread gives up at once

    config = seed(tmp_path, time.time(), minutes=1)
    with monkeypatch.context() as patched:
        patched.setattr(webapp.subprocess, "Popen", Recorded)
        webapp.app_process(load_config(config), config, "127.0.0.1", 8599, open_browser)
    (command,) = started
    for flag in (
        "--server.headless=true",
        "--server.showEmailPrompt=false",
        "--browser.gatherUsageStats=false",
        "--logger.hideWelcomeMessage=true",
    ):
        assert flag in command
    assert not any(part.startswith("--server.headless") and "true" not in part for part in command)
