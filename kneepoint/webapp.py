"""Start the Streamlit app safely: on loopback unless sign-in is configured, trusting no
client's X-Forwarded-For, with XSRF protection, the upload cap, and st.login's settings.

Streamlit reads st.login's provider settings from a secrets file; kneepoint writes one from
kneepoint.yaml's `auth.oidc` into a private temporary folder (mode 0700, file 0600) that
lives as long as the app process, and points Streamlit at it with `--secrets.files`.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import webbrowser
from pathlib import Path

from kneepoint.auth import OidcAuth, listen_problem
from kneepoint.config import Config

APP_ENTRY = Path(__file__).resolve().parent.parent / "app" / "main.py"
# kneepoint's look: Streamlit options (config.toml's [theme], [theme.light], [theme.dark]
# tables) the app is started with as flags, so they hold whatever folder it is started from
# (Streamlit reads .streamlit/config.toml from the working directory only). With both a
# light and a dark table the browser's preference picks one; the app menu's settings can
# switch. No `base`: Streamlit ignores the light and dark tables when one is set.
THEME: dict[str, dict[str, str | int | bool]] = {
    "theme": {
        "font": "sans-serif",
        "baseRadius": "0.5rem",
        "showWidgetBorder": True,
        "metricValueFontSize": "1.6rem",
    },
    "theme.light": {
        "primaryColor": "#0f766e",
        "backgroundColor": "#ffffff",
        "secondaryBackgroundColor": "#f1f5f9",
        "textColor": "#0f172a",
        "linkColor": "#0f766e",
        "borderColor": "#d9e2ec",
    },
    "theme.dark": {
        "primaryColor": "#2dd4bf",
        "backgroundColor": "#0b1220",
        "secondaryBackgroundColor": "#152036",
        "textColor": "#e2e8f0",
        "linkColor": "#5eead4",
        "borderColor": "#24324a",
    },
}
# The product's chrome: the toolbar of a viewer (no "Deploy", a short app menu), and no
# "File change: Rerun" prompt when the app's files change under a running server.
CHROME = {"client.toolbarMode": "viewer", "server.fileWatcherType": "none"}


# Streamlit talks to whoever started it unless it is headless: the first start on a machine
# without ~/.streamlit/credentials.toml asks for an e-mail on the terminal (and exits 255
# when stdin is no terminal: systemd, nohup, CI), and each start prints its own banner and
# may say it collects usage statistics. kneepoint is always headless, never asks, hides the
# banner (it says where the app is itself) and opens the browser itself when asked to.
QUIET = {
    "server.headless": "true",
    "server.showEmailPrompt": "false",
    "browser.gatherUsageStats": "false",
    "logger.hideWelcomeMessage": "true",
}


def look_flags() -> list[str]:
    """The Streamlit flags of kneepoint's look: toolbar and theme."""
    flags = [f"--{name}={value}" for name, value in CHROME.items()]
    for section, options in THEME.items():
        for name, value in options.items():
            text = str(value).lower() if isinstance(value, bool) else str(value)
            flags.append(f"--{section}.{name}={text}")
    return flags


class ListenRefused(RuntimeError):
    """The address is not loopback and the config has no `auth:`; the message says so."""


def check_listen(host: str, config: Config) -> None:
    problem = listen_problem(host, config.auth)
    if problem:
        raise ListenRefused(problem)


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def oidc_secrets(oidc: OidcAuth) -> str:
    """The `[auth]` table st.login reads, as TOML."""
    cookie = oidc.cookie_secret.reveal() if oidc.cookie_secret else secrets.token_urlsafe(32)
    options = f"scope = {_toml(' '.join(oidc.scopes))}"
    if oidc.prompt:
        options += f", prompt = {_toml(oidc.prompt)}"
    return (
        "[auth]\n"
        f"redirect_uri = {_toml(oidc.redirect_uri)}\n"
        f"cookie_secret = {_toml(cookie)}\n"
        f"client_id = {_toml(oidc.client_id)}\n"
        f"client_secret = {_toml(oidc.client_secret.reveal())}\n"
        f"server_metadata_url = {_toml(oidc.metadata_url)}\n"
        f"client_kwargs = {{ {options} }}\n"
    )


def allowed_hosts(config: Config) -> list[str]:
    """The Host names the app's WebSocket accepts (empty: any). Without `auth:` the local user
    is admin, so only loopback names: a web page that re-points its own name at 127.0.0.1
    (DNS rebinding) is refused."""
    if config.auth is None:
        return ["localhost", "127.0.0.1", "::1"]
    return list(config.auth.hosts)


def app_process(
    config: Config,
    config_file: Path,
    host: str,
    port: int,
    open_browser: bool = False,
) -> tuple[subprocess.Popen[bytes], Path | None]:
    """Start the app; return the process and the private folder to remove when it ends."""
    check_listen(host, config)
    env = {
        **os.environ,
        "KNEEPOINT_CONFIG": str(config_file.resolve()),
        # uvicorn believes X-Forwarded-For from loopback peers by default, which would let
        # any local client claim to be the trusted proxy; kneepoint wants the TCP peer.
        "FORWARDED_ALLOW_IPS": "",
    }
    command = [
        sys.executable,
        "-m",
        "kneepoint.appserver",  # Streamlit, its log lines scrubbed from the first
        "run",
        str(APP_ENTRY),
        "--server.address",
        host,
        "--server.port",
        str(port),
        *(f"--{name}={value}" for name, value in QUIET.items()),
        "--server.enableXsrfProtection",
        "true",
        "--server.maxUploadSize",
        str(max(1, round(config.limits.upload_mb))),
        *look_flags(),
        # An exception's text may carry what a secret-scrubbing log would have caught:
        # pages show its type only; the log has the rest.
        "--client.showErrorDetails",
        "type",
        # Streamlit's agent API drives the app over plain HTTP with no WebSocket peer.
        "--server.enableAgentApi",
        "false",
    ]
    for name in allowed_hosts(config):
        command += ["--server.allowedHosts", name]
    private: Path | None = None
    if config.auth is not None and config.auth.oidc is not None:
        private = Path(tempfile.mkdtemp(prefix="kneepoint-auth-"))  # 0700
        secrets_file = private / "secrets.toml"
        descriptor = os.open(secrets_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(oidc_secrets(config.auth.oidc))
        command += ["--secrets.files", str(secrets_file)]
    process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)
    if open_browser:
        threading.Thread(
            target=open_when_ready, args=(process, browser_url(host, port)), daemon=True
        ).start()
    return process, private


def browser_url(host: str, port: int) -> str:
    """The address to open: localhost for loopback or every interface, brackets for IPv6."""
    if host in ("127.0.0.1", "0.0.0.0", "::", "::1", "localhost"):
        host = "localhost"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def open_when_ready(process: subprocess.Popen[bytes], url: str, seconds: float = 120) -> bool:
    """Open `url` in the user's browser (Python's webbrowser: $BROWSER, else the desktop's)
    once the app answers its health check; not if it exits first or never answers."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as answer:
                if answer.status == 200:
                    return webbrowser.open(url)
        except OSError:  # not listening yet (URLError and timeouts are OSErrors)
            pass
        time.sleep(0.3)
    return False


def stop(process: subprocess.Popen[bytes], private: Path | None) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
    if private is not None:
        shutil.rmtree(private, ignore_errors=True)


def run_app(config: Config, config_file: Path, host: str, port: int, open_browser: bool) -> int:
    """Run the app in the foreground until it exits, Ctrl-C or SIGTERM; return its status."""
    process, private = app_process(config, config_file, host, port, open_browser)

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    for signum in (signal.SIGTERM, signal.SIGHUP):  # a service manager, a closed terminal
        signal.signal(signum, interrupt)
    try:
        return process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        stop(process, private)
