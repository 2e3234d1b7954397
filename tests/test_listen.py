"""Where kneepoint listens: loopback unless the config has `auth:`. `serve` and `demo` refuse a
non-loopback --host without it, in one sentence and before starting anything; with
`auth: {mode: none}` the app starts there and every page carries the "No sign-in" banner
(seen in a real Chromium)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.registry import PAGES
from kneepoint.auth import listen_problem
from tests.conftest import free_port, require_real, wait_until_healthy
from tests.real.test_browser import CHROMIUM, ERROR_BOXES
from tests.seed import seed


def kneepoint(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kneepoint.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


def lan_address() -> str | None:
    """This machine's address on its default route (no packet is sent), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


def bare_config(folder: Path, auth: str = "") -> Path:
    """A config whose database does not exist yet: anything that got past the address
    check would say so (or create it)."""
    path = folder / "kneepoint.yaml"
    path.write_text(f"database: sqlite:///{folder / 'k.db'}\ntargets: []\n{auth}")
    return path


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "lan"])
def test_serve_refuses_a_network_address_without_auth_before_starting_anything(
    tmp_path: Path, host: str
) -> None:
    if host == "lan":
        host = lan_address() or "192.0.2.2"
    config = bare_config(tmp_path)
    port = free_port()
    refused = kneepoint("serve", "--host", host, "--port", str(port), "--config", str(config))
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr == f"kneepoint: {listen_problem(host, None)}\n"
    assert refused.stdout == ""
    assert not (tmp_path / "k.db").exists()  # not even the database was opened
    with socket.socket() as sock:  # and nothing listens on the port
        assert sock.connect_ex(("127.0.0.1", port)) != 0


def test_the_sentence_says_what_to_set(tmp_path: Path) -> None:
    refused = kneepoint("serve", "--host", "0.0.0.0", "--config", str(bare_config(tmp_path)))
    assert refused.stderr.strip() == (
        "kneepoint: refusing to listen on 0.0.0.0 without sign-in: set `auth:` in "
        "kneepoint.yaml (mode oidc or proxy, or `auth: {mode: none}` to allow everyone on the "
        "network)"
    )


def test_demo_refuses_a_network_address_before_its_backfill(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    refused = kneepoint("demo", "--host", "0.0.0.0", "--dir", str(folder), "--no-browser")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr == f"kneepoint: {listen_problem('0.0.0.0', None)}\n"
    assert not (folder / "kneepoint.db").exists()  # no week of history was simulated


def test_loopback_needs_no_auth(tmp_path: Path) -> None:
    """--host 127.0.0.1 passes the address check without `auth:` (it then stops at the
    missing database, which says the check was passed)."""
    config = bare_config(tmp_path)
    passed = kneepoint("serve", "--host", "127.0.0.1", "--config", str(config))
    assert passed.returncode == 2
    assert "refusing to listen" not in passed.stderr
    assert "does not exist" in passed.stderr and "kneepoint migrate" in passed.stderr


@dataclass
class Served:
    loopback: str
    lan: str | None  # the same server through this machine's network address, if it has one


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`kneepoint serve --host 0.0.0.0` with `auth: {mode: none}` on a seeded store."""
    folder = tmp_path_factory.mktemp("listen")
    config = seed(folder, time.time())
    config.write_text(config.read_text() + "auth: {mode: none}\n")
    port = free_port()
    log = folder / "serve.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kneepoint.cli",
                "serve",
                "--host",
                "0.0.0.0",
                "--port",
                str(port),
                "--no-browser",
                "--config",
                str(config),
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        loopback = f"http://127.0.0.1:{port}"
        wait_until_healthy(process, f"{loopback}/_stcore/health", 90, log.read_text)
        address = lan_address()
        yield Served(loopback, f"http://{address}:{port}" if address else None)
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0, log.read_text()[-3000:]


def test_with_auth_mode_none_serve_answers_on_every_interface(served: Served) -> None:
    assert httpx.get(f"{served.loopback}/_stcore/health", timeout=10).text == "ok"
    if served.lan is None:
        require_real("this machine has no non-loopback IPv4 address to reach the app on")
    assert httpx.get(f"{served.lan}/_stcore/health", timeout=10).text == "ok"


@pytest.fixture(scope="module")
def browser():  # type: ignore[no-untyped-def]
    if not Path(CHROMIUM).exists():
        require_real(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require_real("the playwright Python package is not installed")
    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"],
        )
        yield instance
        instance.close()


VIEWER_PAGES = [spec for spec in PAGES if spec.role == "viewer"]


@pytest.mark.real
@pytest.mark.parametrize("spec", VIEWER_PAGES, ids=lambda spec: spec.url_path)
def test_every_page_carries_the_no_sign_in_banner(browser, served: Served, spec) -> None:  # type: ignore[no-untyped-def]
    base = served.lan or served.loopback  # as a colleague on the network opens it
    path = "" if spec == PAGES[0] else spec.url_path
    page = browser.new_page()
    try:
        page.goto(f"{base}/{path}")
        page.wait_for_selector("h1", timeout=60_000)
        assert page.locator("h1").first.inner_text().strip() == spec.title
        banner = page.get_by_text("No sign-in: everyone who can reach this address")
        banner.first.wait_for(state="visible", timeout=30_000)
        assert "uses kneepoint as viewer" in banner.first.inner_text()
        assert page.locator(ERROR_BOXES).count() == 0
        sidebar = page.locator('[data-testid="stSidebar"]').inner_text()
        assert "Signed in as anonymous (viewer)" in sidebar
        assert "Audit" not in page.locator('[data-testid="stSidebarNav"]').inner_text()
    finally:
        page.close()


@pytest.mark.real
def test_a_viewer_opening_the_audit_address_sees_no_audit_trail(browser, served: Served) -> None:  # type: ignore[no-untyped-def]
    page = browser.new_page()
    try:
        page.goto(f"{served.lan or served.loopback}/audit")
        page.wait_for_selector("h1", timeout=60_000)
        page.wait_for_load_state("networkidle")
        assert page.locator("h1").first.inner_text().strip() != "Audit"
        assert page.get_by_text("No sign-in: everyone who can reach").count() >= 1
    finally:
        page.close()


@pytest.fixture(scope="module")
def served_locally(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`kneepoint serve` on loopback with no `auth:` (the local user is admin)."""
    folder = tmp_path_factory.mktemp("local")
    config = seed(folder, time.time())
    port = free_port()
    log = folder / "serve.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "kneepoint.cli", "serve", "--port", str(port)),
                *("--no-browser", "--config", str(config)),
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_healthy(process, f"{url}/_stcore/health", 90, log.read_text)
        yield url
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0, log.read_text()[-3000:]


def websocket_status(url: str, host: str) -> str:
    """The status line the app's WebSocket endpoint answers a handshake with this Host (and
    a matching Origin, as a browser on that name would send)."""
    import socket

    port = int(url.rsplit(":", 1)[1])
    request = (
        "GET /_stcore/stream HTTP/1.1\r\n"
        f"Host: {host}:{port}\r\n"
        f"Origin: http://{host}:{port}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Protocol: streamlit\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(request.encode())
        return connection.recv(4096).decode("latin-1").split("\r\n", 1)[0]


def test_without_auth_a_page_on_another_name_cannot_open_the_app_dns_rebinding(
    served_locally: str,
) -> None:
    """A web page whose own name was re-pointed at 127.0.0.1 reaches the app with its own
    name as Host and Origin; the local user is admin, so only loopback names are let in."""
    assert " 101 " in websocket_status(served_locally, "localhost") + " "
    assert " 101 " in websocket_status(served_locally, "127.0.0.1") + " "
    refused = websocket_status(served_locally, "rebound.attacker.example")
    assert " 101 " not in refused + " ", refused
