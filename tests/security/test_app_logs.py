"""The app's process scrubs its log lines too, not only the command line's: Streamlit gives
each of its loggers (uvicorn's too) a stderr handler of its own that does not propagate, so
the command line's scrubbing handler on the root logger never saw them. Every log record is
now scrubbed where it is made (kneepoint/secrets.py `scrub_log_records`), installed by the
app's script (app/main.py) and, before Streamlit starts, by the process `kneepoint serve`
starts (kneepoint/appserver.py).

Each check runs in a Python process of its own: the record factory is process-wide."""

from __future__ import annotations

import os
import secrets as random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.seed import seed

ROOT = Path(__file__).resolve().parents[2]

# What the child logs, once the config's secrets are known: through Streamlit's loggers (the
# one that reports an app's uncaught exception, with its traceback, and uvicorn's), and a
# kneepoint logger, each with the secret in its message, its arguments or its exception.
LOG_LINES = """
import logging
from streamlit.logger import get_logger, init_uvicorn_logs

init_uvicorn_logs()
try:
    raise RuntimeError("cannot reach the channel with " + CANARY)
except RuntimeError as error:
    get_logger("streamlit.error_util").error("Uncaught app execution", exc_info=error)
get_logger("uvicorn.error").warning("handshake from %s refused", CANARY)
logging.getLogger("kneepoint.app").warning("sent with secret %s", CANARY)
print("logged", flush=True)
"""


def canary_config(folder: Path) -> tuple[Path, str]:
    canary = f"kplogcanary{random.token_hex(8)}"
    config = seed(folder, time.time(), minutes=1)
    config.write_text(
        config.read_text()
        + f"channels:\n  - {{name: c, type: webhook, url: 'http://127.0.0.1:9/h', "
        f"secret: '{canary}'}}\n"
    )
    return config, canary


def run_child(script: str, config: Path, canary: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", f"CANARY = {canary!r}\n" + script],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env={**os.environ, "KNEEPOINT_CONFIG": str(config)},
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert "logged" in done.stdout, said[-3000:]
    return done.stderr


def assert_scrubbed(stderr: str, canary: str) -> None:
    # The lines were written ...
    assert "Uncaught app execution\nTraceback (most recent call last):" in stderr, stderr
    assert "RuntimeError: cannot reach the channel with ***" in stderr, stderr
    assert "handshake from *** refused" in stderr, stderr
    assert "sent with secret ***" in stderr, stderr
    # ... and none of them shows the secret.
    assert canary not in stderr, stderr


def test_the_app_script_scrubs_streamlits_log_lines(tmp_path: Path) -> None:
    """app/main.py, run as Streamlit runs it (AppTest), then Streamlit's loggers write."""
    config, canary = canary_config(tmp_path)
    script = textwrap.dedent(
        """
        from streamlit.testing.v1 import AppTest

        app = AppTest.from_file("app/main.py", default_timeout=120).run()
        assert not app.exception, app.exception
        """
    )
    assert_scrubbed(run_child(script + LOG_LINES, config, canary), canary)


def test_the_app_process_scrubs_from_before_streamlit_starts(tmp_path: Path) -> None:
    """kneepoint/appserver.py, the module `kneepoint serve` starts the app with: Streamlit's
    command line (here replaced by the logging above) finds the scrubbing in place and the
    config's secrets known, before any page has run."""
    config, canary = canary_config(tmp_path)
    script = textwrap.dedent(
        """
        import streamlit.web.cli

        def streamlit_main(prog_name):
            exec(LOG_LINES)

        streamlit.web.cli.main = streamlit_main
        from kneepoint import appserver

        appserver.main()
        """
    )
    stderr = run_child(f"LOG_LINES = {LOG_LINES!r}\n" + script, config, canary)
    assert_scrubbed(stderr, canary)


def test_serve_starts_the_app_through_the_scrubbing_module(tmp_path: Path) -> None:
    from kneepoint import webapp
    from kneepoint.config import load_config

    started: list[list[str]] = []

    class Recorded:
        def __init__(self, command: list[str], **_: object) -> None:
            started.append(command)

    config = seed(tmp_path, time.time(), minutes=1)
    original = webapp.subprocess.Popen
    webapp.subprocess.Popen = Recorded  # type: ignore[assignment,misc]
    try:
        webapp.app_process(load_config(config), config, "127.0.0.1", 8599)
    finally:
        webapp.subprocess.Popen = original  # type: ignore[misc]
    (command,) = started
    assert command[1:5] == ["-m", "kneepoint.appserver", "run", str(webapp.APP_ENTRY)]
