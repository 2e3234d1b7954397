"""Proxy sign-in behind a real reverse proxy: Debian's nginx in front of `kneepoint serve`,
driven by a real Chromium.

nginx stands in for oauth2-proxy: it signs people in (HTTP basic auth against an htpasswd
file), sets X-Forwarded-Email and X-Forwarded-Groups itself, overriding whatever the browser
sent, proxies Streamlit's WebSocket, and connects to the app from 127.0.0.2 (`proxy_bind`),
the one address kneepoint's `auth.proxy.trusted` names. A browser that goes to the app
directly, on 127.0.0.1, with the same headers (and an X-Forwarded-For naming the proxy) is
refused: kneepoint believes the headers only on connections from the proxy's address.
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from kneepoint import audit
from kneepoint.config import load_config
from kneepoint.store.db import connect_store
from tests.conftest import free_port, migrated, require_real, wait_until_healthy

CHROMIUM = "/usr/bin/chromium"
NGINX = "/usr/sbin/nginx"
PROXY_ADDRESS = "127.0.0.2"
ERROR_BOXES = '[data-testid="stException"], [data-testid="stAlertContentError"]'
TIMEOUT_MS = 60_000

# Who the proxy knows: user, password, and the groups it vouches for.
PEOPLE = {
    "viewer": ("viewer-pass", ""),
    "operator": ("operator-pass", "oncall"),
    "admin": ("admin-pass", "platform-admins,oncall"),
}
DOMAIN = "example.com"


def email(user: str) -> str:
    return f"{user}@{DOMAIN}"


@dataclass(frozen=True)
class Stack:
    proxy: str  # through nginx
    app: str  # the app itself, on 127.0.0.1
    config: Path

    def refused_sign_ins(self, address: str) -> int:
        """Refused sign-ins from `address` in the audit trail."""
        with connect_store(load_config(self.config).database)() as session:
            entries = audit.entries(session, 0.0)
        return sum(
            e.action == "sign-in" and e.outcome == "refused" and e.address == address
            for e in entries
        )


def write_config(folder: Path) -> Path:
    config = folder / "kneepoint.yaml"
    config.write_text(f"""
database: sqlite:///{folder / "kneepoint.db"}
auth:
  mode: proxy
  proxy:
    trusted: [{PROXY_ADDRESS}/32]
  allowed_domains: [{DOMAIN}]
  admins: ["group:platform-admins"]
  operators: ["group:oncall"]
  default_role: viewer
""")
    return migrated(config)


def nginx_conf(folder: Path, listen: int, upstream: int) -> Path:
    """The proxy's whole configuration, every path under `folder` (no system files)."""
    htpasswd = folder / "htpasswd"
    htpasswd.write_text(
        "".join(f"{user}:{{PLAIN}}{password}\n" for user, (password, _) in PEOPLE.items())
    )
    groups = "".join(f'        {user} "{group}";\n' for user, (_, group) in PEOPLE.items())
    # Workers of a root master run as `user`; they read the htpasswd in this private folder.
    user = f"user {getpass.getuser()};\n" if os.geteuid() == 0 else ""
    conf = folder / "nginx.conf"
    conf.write_text(f"""
{user}daemon off;
master_process on;
worker_processes 1;
pid {folder / "nginx.pid"};
error_log {folder / "error.log"} info;
events {{ worker_connections 64; }}
http {{
    access_log {folder / "access.log"};
    client_body_temp_path {folder / "client_body"};
    proxy_temp_path {folder / "proxy"};
    fastcgi_temp_path {folder / "fastcgi"};
    uwsgi_temp_path {folder / "uwsgi"};
    scgi_temp_path {folder / "scgi"};

    map $remote_user $kneepoint_groups {{
        default "";
{groups}    }}
    map $http_upgrade $connection_upgrade {{
        default upgrade;
        "" close;
    }}

    server {{
        listen 127.0.0.1:{listen};
        auth_basic "kneepoint";
        auth_basic_user_file {htpasswd};

        location / {{
            proxy_pass http://127.0.0.1:{upstream};
            proxy_bind {PROXY_ADDRESS};
            proxy_http_version 1.1;
            proxy_set_header Host $http_host;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_set_header X-Forwarded-For $remote_addr;
            # The identity: set here, replacing any header of these names the client sent.
            proxy_set_header X-Forwarded-Email $remote_user@{DOMAIN};
            proxy_set_header X-Forwarded-Groups $kneepoint_groups;
            proxy_set_header Authorization "";
            proxy_read_timeout 1h;
            proxy_buffering off;
        }}
    }}
}}
""")
    return conf


def _logs(*files: Path) -> str:
    return "\n".join(f.read_text(errors="replace") for f in files if f.exists())


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if not Path(NGINX).exists():
        require_real(f"no nginx at {NGINX} (apt-get install nginx)")
    folder = tmp_path_factory.mktemp("proxy-signin")
    config = write_config(folder)
    app_port, proxy_port = free_port(), free_port()
    app_log = (folder / "serve.log").open("w")
    app = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kneepoint.cli",
            "serve",
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(app_port),
            "--no-browser",
        ],
        stdout=app_log,
        stderr=subprocess.STDOUT,
    )
    prefix = folder / "nginx"
    prefix.mkdir()
    conf = nginx_conf(prefix, proxy_port, app_port)
    proxy = subprocess.Popen(
        [NGINX, "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    app_url, proxy_url = f"http://127.0.0.1:{app_port}", f"http://127.0.0.1:{proxy_port}"
    try:
        wait_until_healthy(
            app, f"{app_url}/_stcore/health", 90, lambda: _logs(folder / "serve.log")
        )
        wait_until_healthy(
            proxy,
            f"http://admin:{PEOPLE['admin'][0]}@127.0.0.1:{proxy_port}/_stcore/health",
            30,
            lambda: _logs(prefix / "error.log"),
        )
        # nginx is the gate: without a password it lets nothing through to the app.
        assert httpx.get(f"{proxy_url}/", timeout=5).status_code == 401
        yield Stack(proxy_url, app_url, config)
    finally:
        for process in (proxy, app):
            process.terminate()
        for process in (proxy, app):
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
        app_log.close()


@pytest.fixture(scope="module")
def browser():  # type: ignore[no-untyped-def]
    if not Path(CHROMIUM).exists() or shutil.which("chromium") is None:
        require_real(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require_real("the playwright Python package is not installed")
    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
                "--disable-sync",
            ],
        )
        yield instance
        instance.close()


def signed_in_page(browser: Any, stack: Stack, user: str, path: str = "", **options: Any) -> Any:
    """A fresh browser profile that signs in to the proxy as `user` and opens `path`."""
    password = PEOPLE[user][0]
    context = browser.new_context(
        http_credentials={"username": user, "password": password},
        viewport={"width": 2200, "height": 1200},
        **options,
    )
    page = context.new_page()
    page.goto(f"{stack.proxy}/{path}")
    return page


def wait_for(locator: Any, page: Any, what: str, state: str = "visible") -> None:
    """Wait for `locator`; failing, say what the page shows instead (an error box, say)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        locator.wait_for(state=state, timeout=TIMEOUT_MS)
    except PlaywrightTimeout:
        shown = page.locator("body").inner_text()[-3000:]
        pytest.fail(f"no {what} within {TIMEOUT_MS / 1000:g} s; the page shows:\n{shown}")


def wait_for_text(page: Any, text: str) -> None:
    wait_for(page.get_by_text(text, exact=False).first, page, repr(text))


def sidebar_says(page: Any, user: str, role: str) -> None:
    """The app names the person and role the proxy vouched for."""
    caption = page.locator('[data-testid="stSidebar"]').get_by_text("Signed in as")
    wait_for(caption, page, "'Signed in as' in the sidebar")
    said = caption.inner_text().strip()
    assert said == f"Signed in as {email(user)} ({role})", said


def submit_silence(page: Any, matchers: str, comment: str) -> None:
    form = page.locator('[data-testid="stForm"]')
    wait_for(form.get_by_label("Matchers"), page, "silence form")
    form.get_by_label("Matchers").fill(matchers)
    form.get_by_label("Comment (required)").fill(comment)
    form.get_by_role("button", name="Silence").click()


@pytest.mark.real
def test_a_viewer_sees_pages_and_is_refused_a_silence(browser: Any, stack: Stack) -> None:
    page = signed_in_page(browser, stack, "viewer", "alerts")
    try:
        sidebar_says(page, "viewer", "viewer")
        wait_for(page.locator("h1", has_text="Alerts"), page, "Alerts heading")
        # The menu holds the viewer's pages, not the admin's Audit page.
        nav = page.locator('[data-testid="stSidebarNav"]')
        wait_for(nav.get_by_text("Overview"), page, "menu entry Overview")
        assert nav.get_by_text("Audit").count() == 0
        submit_silence(page, "alertname=kv-cache-saturated", "viewer tries")
        refusal = page.locator('[data-testid="stAlertContentError"]')
        wait_for(refusal, page, "refusal")
        text = refusal.inner_text()
        assert "needs the operator role" in text and email("viewer") in text, text
        assert page.get_by_text("Silence #").count() == 0
    finally:
        page.context.close()


@pytest.mark.real
def test_an_operator_silences_and_the_admin_audits_it(browser: Any, stack: Stack) -> None:
    comment = "maintenance window, proxy test"
    page = signed_in_page(browser, stack, "operator", "alerts")
    try:
        sidebar_says(page, "operator", "operator")
        submit_silence(page, "alertname=kv-cache-saturated", "")
        wait_for_text(page, "a silence needs a comment")
        submit_silence(page, "alertname=kv-cache-saturated, replica=replica-a", comment)
        wait_for_text(page, "created.")
        created = page.get_by_text("Silence #").first.inner_text()
        number = created.split("#", 1)[1].split()[0]
        # Opened again, the list of silences names the operator, from the proxy's header, as
        # the author.
        page.reload()
        line = page.get_by_text(f"{email('operator')}: {comment}")
        wait_for(line, page, "silence line")
        assert line.inner_text().startswith(f"#{number} "), line.inner_text()
    finally:
        page.context.close()

    page = signed_in_page(browser, stack, "admin", "audit")
    try:
        sidebar_says(page, "admin", "admin")
        wait_for(page.locator("h1", has_text="Audit"), page, "Audit heading")
        grid = page.locator('[data-testid="stDataFrame"]')
        wait_for(grid, page, "audit table")
        cells = audit_row(page, f"silence {number}")
        assert email("operator") in cells and "operator" in cells, cells  # actor, role
        assert "proxy" in cells and PROXY_ADDRESS in cells, cells  # via, address
        # The outcome is a badge: "● done" (app/tables.py).
        assert "silence.create" in cells and "● done" in cells, " | ".join(cells)
        assert any(comment in cell for cell in cells), cells  # the change, after
        assert page.locator(ERROR_BOXES).count() == 0
    finally:
        page.context.close()


def audit_row(page: Any, subject: str) -> list[str]:
    """The cells of the Audit table's row about `subject`, read from the data grid's
    accessible table (the grid itself draws on a canvas)."""
    grid = page.locator('[data-testid="stDataFrame"]')
    cell = grid.locator('[role="gridcell"]').filter(has_text=subject)
    wait_for(cell.first, page, f"audit row about {subject}", state="attached")
    row = cell.first.locator("xpath=ancestor::*[@role='row'][1]")
    return [text.strip() for text in row.locator('[role="gridcell"]').all_text_contents()]


SPOOFED = {"X-Forwarded-Email": email("admin"), "X-Forwarded-Groups": "platform-admins"}


@pytest.mark.real
def test_the_proxy_replaces_identity_headers_a_client_sends(browser: Any, stack: Stack) -> None:
    """Through nginx, a viewer who sends the admin's headers is still the viewer."""
    page = signed_in_page(browser, stack, "viewer", "audit", extra_http_headers=SPOOFED)
    try:
        sidebar_says(page, "viewer", "viewer")
        assert page.get_by_text(f"Signed in as {email('admin')}").count() == 0
        nav = page.locator('[data-testid="stSidebarNav"]')
        wait_for(nav.get_by_text("Overview"), page, "menu entry Overview")
        assert nav.get_by_text("Audit").count() == 0
    finally:
        page.context.close()


@pytest.mark.real
@pytest.mark.parametrize(
    "headers",
    [SPOOFED, {**SPOOFED, "X-Forwarded-For": PROXY_ADDRESS}],
    ids=["identity-headers", "and-x-forwarded-for"],
)
def test_the_same_headers_sent_directly_to_the_app_are_refused(
    browser: Any, stack: Stack, headers: dict[str, str]
) -> None:
    context = browser.new_context(extra_http_headers=headers)
    page = context.new_page()
    # What Chromium sent on the app's WebSocket handshake, where the identity is read.
    handshakes: list[dict[str, str]] = []
    cdp = context.new_cdp_session(page)
    cdp.on(
        "Network.webSocketWillSendHandshakeRequest",
        lambda event: handshakes.append(event["request"]["headers"]),
    )
    cdp.send("Network.enable")
    refused_before = stack.refused_sign_ins("127.0.0.1")
    try:
        page.goto(f"{stack.app}/audit")
        refusal = page.locator('[data-testid="stAlertContentError"]')
        wait_for(refusal, page, "refusal")
        text = refusal.inner_text()
        assert text.startswith("No access:"), text
        assert "did not come through the trusted proxy" in text and "127.0.0.1" in text, text
        assert page.get_by_text("Signed in as").count() == 0
        assert page.locator('[data-testid="stSidebarNav"]').count() == 0
        assert page.locator("h1", has_text="Audit").count() == 0
        sent = [{k.lower(): v for k, v in h.items()} for h in handshakes]
        assert any(
            all(h.get(name.lower()) == value for name, value in headers.items()) for h in sent
        ), sent
        # The refusal is in the audit trail, from the address the connection really came from.
        assert stack.refused_sign_ins("127.0.0.1") == refused_before + 1
        assert stack.refused_sign_ins(PROXY_ADDRESS) == 0
    finally:
        context.close()
