"""Sign-in with OpenID Connect, end to end: `kneepoint serve` with `auth.mode: oidc` against a
real provider (panva's certified oidc-provider, tests/real/oidc_provider.py), and real
Chromium through the whole redirect flow (the app's sign-in page, the provider's login form,
back to the app with Streamlit's identity cookie).

Roles come from the provider's `groups` claim: `group:oncall` operates, `group:sre-leads`
administers, anyone else the provider vouches for views. A viewer sees the pages and the
new-silence form, and submitting it is refused by the action on the server (the form is not
hidden, so the refusal can only come from the handler); an operator creates a silence and is
its author; an admin sees both on the Audit page.
"""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.conftest import (
    VLLM_032,
    Route,
    free_port,
    migrated,
    require_real,
    serving_metrics,
    wait_until_healthy,
)
from tests.real.oidc_provider import OidcProvider, running_provider

CHROMIUM = "/usr/bin/chromium"
SECRET_VARIABLE = "KNEEPOINT_TEST_OIDC_CLIENT_SECRET"
WAIT = 60_000  # ms: the most any step may take on a loaded machine (only a failure waits)

pytestmark = pytest.mark.real


@dataclass
class SignInApp:
    url: str  # what the browser opens: the host of the registered redirect URI
    provider: OidcProvider
    log: Path


@pytest.fixture(scope="module")
def signin_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SignInApp]:
    folder = tmp_path_factory.mktemp("oidc")
    port = free_port()
    # The app listens on loopback; the browser calls it localhost, the name registered with
    # the provider (its own host is 127.0.0.1, so the two keep separate cookies).
    url = f"http://localhost:{port}"
    client_secret = secrets.token_urlsafe(24)
    with (
        running_provider(
            folder / "provider", f"{url}/oauth2callback", "kneepoint", client_secret
        ) as provider,
        serving_metrics() as targets,
        pytest.MonkeyPatch.context() as env,
    ):
        targets.routes = {"/a": Route(VLLM_032.read_bytes())}
        env.setenv(SECRET_VARIABLE, client_secret)  # for `kneepoint migrate` and serve
        config = folder / "kneepoint.yaml"
        config.write_text(f"""
database: sqlite:///{folder / "kneepoint.db"}
scrape_interval: 5s
targets:
  - {{name: replica-a, kind: vllm, url: "{targets.url("/a")}", timeout: 2s}}
auth:
  mode: oidc
  oidc:
    issuer: {provider.issuer}
    client_id: kneepoint
    client_secret: ${{{SECRET_VARIABLE}}}
    redirect_uri: {url}/oauth2callback
    groups_claim: groups
    scopes: [openid, email, profile, groups]
  allowed_domains: [example.com]
  operators: ["group:oncall"]
  admins: ["group:sre-leads"]
""")
        migrated(config)
        log = folder / "serve.log"
        with log.open("w") as output:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "kneepoint.cli",
                    "serve",
                    "--config",
                    str(config),
                    "--port",
                    str(port),
                    "--no-browser",
                ],
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_until_healthy(process, f"{url}/_stcore/health", 90, log.read_text)
            yield SignInApp(url, provider, log)
        finally:
            process.terminate()
            process.wait(timeout=30)
    # The client secret travels only to the provider's token endpoint, never into the log.
    assert client_secret not in log.read_text()


@pytest.fixture(scope="module")
def chromium():  # type: ignore[no-untyped-def]
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
            args=["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"],
        )
        yield instance
        instance.close()


def sign_in(chromium, app: SignInApp, email: str, wide: bool = False, then: str = ""):  # type: ignore[no-untyped-def]
    """A fresh browser (its own cookies) signs in as `email` through the provider's form;
    returns the page, back on the app and showing `then` (by default "Signed in as <email>").
    Every request the browser made is in page.requests."""
    from playwright.sync_api import expect

    # Wide enough for every column of the Audit page's table (it draws only those in view).
    context = chromium.new_context(viewport={"width": 3200, "height": 1200} if wide else None)
    page = context.new_page()
    page.requests = []  # type: ignore[attr-defined]
    page.on("request", lambda request: page.requests.append(request.url))
    page.goto(app.url)
    # Not signed in: the sign-in page and nothing else, not even the menu.
    expect(page.get_by_text("Sign in to see the fleet.")).to_be_visible(timeout=WAIT)
    assert page.locator('[data-testid="stSidebarNav"]').count() == 0
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile("^" + re.escape(app.provider.issuer) + "/interaction/"))
    page.get_by_label("E-mail").fill(email)
    page.get_by_label("Password").fill("any password")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile("^" + re.escape(app.url) + "/"), timeout=WAIT)
    expect(page.get_by_text(then or f"Signed in as {email}")).to_be_visible(timeout=WAIT)
    return page


def open_alerts(page, app: SignInApp):  # type: ignore[no-untyped-def]
    from playwright.sync_api import expect

    page.goto(f"{app.url}/alerts")
    expect(page.locator("h1").first).to_have_text("Alerts", timeout=WAIT)
    expect(page.get_by_label("Matchers")).to_be_visible(timeout=WAIT)


def submit_silence(page, matchers: str, comment: str) -> None:  # type: ignore[no-untyped-def]
    form = page.locator('[data-testid="stForm"]')
    form.get_by_label("Matchers").fill(matchers)
    form.get_by_label("Comment (required)").fill(comment)
    form.get_by_role("button", name="Silence").click()


def test_roles_from_the_providers_groups_decide_on_the_server(chromium, signin_app) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import expect

    app = signin_app
    matchers = "alertname=kv-cache-saturated, replica=replica-a"

    # A viewer signs in through the provider and sees the fleet's pages.
    viewer = sign_in(chromium, app, "viewer@example.com")
    expect(viewer.get_by_text("Signed in as viewer@example.com (viewer)")).to_be_visible()
    authorize = [u for u in viewer.requests if u.startswith(f"{app.provider.issuer}/auth?")]
    assert authorize, viewer.requests
    query = parse_qs(urlsplit(authorize[0]).query)
    assert query["client_id"] == ["kneepoint"]
    assert query["redirect_uri"] == [f"{app.url}/oauth2callback"]
    assert query["code_challenge_method"] == ["S256"] and query["code_challenge"]
    assert set(query["scope"][0].split()) >= {"openid", "email", "groups"}
    cookies = {c["name"]: c for c in viewer.context.cookies(app.url)}
    assert cookies["_streamlit_user"]["httpOnly"]
    nav = viewer.locator('[data-testid="stSidebarNav"]')
    expect(nav.get_by_text("Alerts")).to_be_visible(timeout=WAIT)
    assert nav.get_by_text("Audit").count() == 0  # an admin's page is not in a viewer's menu

    # The form is there for a viewer too; the action itself refuses, naming the role.
    open_alerts(viewer, app)
    submit_silence(viewer, matchers, "viewer tries to mute a replica")
    refusal = "Creating a silence needs the operator role; viewer@example.com has the viewer role."
    expect(viewer.get_by_text(refusal)).to_be_visible(timeout=WAIT)
    viewer.reload()
    expect(viewer.get_by_text("No silence is active or scheduled.")).to_be_visible(timeout=WAIT)
    # Typing the Audit page's address does not open it for a viewer either.
    viewer.goto(f"{app.url}/audit")
    expect(viewer.get_by_text("Signed in as viewer@example.com")).to_be_visible(timeout=WAIT)
    expect(viewer.get_by_text("Page not found")).to_be_visible(timeout=WAIT)
    expect(viewer.locator("h1").first).to_have_text("Overview", timeout=WAIT)
    assert viewer.get_by_text("Who did what, when and from where").count() == 0
    # Signing out ends the provider's session too, and the app asks for a sign-in again.
    viewer.goto(app.url)  # (the "Page not found" dialog holds the page until closed)
    expect(viewer.get_by_text("Signed in as viewer@example.com")).to_be_visible(timeout=WAIT)
    viewer.locator('[data-testid="stSidebar"]').get_by_role("button", name="Sign out").click()
    viewer.wait_for_url(re.compile("^" + re.escape(app.provider.issuer) + "/session/end"))
    viewer.get_by_role("button", name="Yes, sign me out").click()
    expect(viewer.get_by_text("Sign in to see the fleet.")).to_be_visible(timeout=WAIT)
    assert viewer.url.startswith(app.url)
    assert "_streamlit_user" not in {c["name"] for c in viewer.context.cookies(app.url)}
    viewer.context.close()

    # An operator (another browser, other cookies) creates the silence and is its author.
    operator = sign_in(chromium, app, "operator@example.com")
    expect(operator.get_by_text("Signed in as operator@example.com (operator)")).to_be_visible()
    open_alerts(operator, app)
    comment = "draining replica-a for a driver update"
    submit_silence(operator, matchers, comment)
    created = operator.get_by_text(re.compile(r"Silence #\d+ created\."))
    expect(created).to_be_visible(timeout=WAIT)
    number = re.search(r"#(\d+)", created.inner_text()).group(1)  # type: ignore[union-attr]
    operator.reload()
    listed = f"#{number} alertname=kv-cache-saturated, replica=replica-a, operator@example.com: "
    expect(operator.get_by_text(listed + comment)).to_be_visible(timeout=WAIT)
    operator.context.close()

    # The provider vouches for someone outside auth.allowed_domains: no access at all, even
    # with a group that operates.
    stranger = sign_in(
        chromium,
        app,
        "stranger@example.org",
        then="No access: stranger@example.org is not in auth.allowed_emails or "
        "auth.allowed_domains.",
    )
    assert stranger.locator('[data-testid="stSidebarNav"]').count() == 0
    stranger.goto(f"{app.url}/alerts")
    expect(stranger.get_by_text("No access: stranger@example.org")).to_be_visible(timeout=WAIT)
    assert stranger.get_by_label("Matchers").count() == 0
    stranger.context.close()

    # An admin sees both on the Audit page: the operator's silence and the viewer's refusal.
    admin = sign_in(chromium, app, "admin@example.com", wide=True)
    expect(admin.get_by_text("Signed in as admin@example.com (admin)")).to_be_visible()
    admin.goto(f"{app.url}/audit")
    expect(admin.locator("h1").first).to_have_text("Audit", timeout=WAIT)
    rows = audit_rows(admin)
    # The table is for people (app/tables.py): human headers, the outcome a badge, "● done".
    done = [r for r in rows if r["Action"] == "silence.create" and r["Outcome"] == "● done"]
    assert [(r["Who"], r["Via"], r["Subject"]) for r in done] == [
        ("operator@example.com", "oidc", f"silence {number}")
    ], rows
    assert comment in done[0]["After"] and "kv-cache-saturated" in done[0]["After"]
    refused = [r for r in rows if r["Action"] == "silence.create" and r["Outcome"] == "● refused"]
    assert [(r["Who"], r["Role"]) for r in refused] == [("viewer@example.com", "viewer")], rows
    assert refusal in refused[0]["Detail"]
    signed = {r["Who"] for r in rows if r["Action"] == "sign-in" and r["Outcome"] == "● done"}
    assert signed == {"viewer@example.com", "operator@example.com", "admin@example.com"}
    turned_away = {r["Who"] for r in rows if r["Action"] == "sign-in" and r["Outcome"] != "● done"}
    assert turned_away == {"stranger@example.org"}, rows
    admin.context.close()

    # Each of them signed in through the provider's own form, in this order.
    assert app.provider.signed_in() == [
        "viewer@example.com",
        "operator@example.com",
        "stranger@example.org",
        "admin@example.com",
    ], app.provider.log()


_READ_GRID = """grid => ({
    header: Object.fromEntries(Array.from(grid.querySelectorAll('th[role=columnheader]'))
        .map(th => [th.getAttribute('aria-colindex'), th.innerText.trim()])),
    rows: Array.from(grid.querySelectorAll('tbody tr[role=row]')).map(tr => [
        Number(tr.getAttribute('aria-rowindex')),
        Array.from(tr.querySelectorAll('td[role=gridcell]'))
            .map(td => [td.getAttribute('aria-colindex'), td.innerText]),
    ]),
    count: Number(grid.getAttribute('aria-rowcount')) - 1,
    columns: Number(grid.getAttribute('aria-colcount')),
})"""


def audit_rows(page) -> list[dict[str, str]]:  # type: ignore[no-untyped-def]
    """The Audit page's table as the browser shows it, one dict per row (newest first),
    keyed by the headers it shows ("Who", "Action", "Outcome", ...).

    st.dataframe draws on a canvas and keeps an accessible table of the cells in view
    beside it; the page is wide enough for every column, and the table is scrolled down
    until every row has been in view."""
    from playwright.sync_api import expect

    frame = page.locator('[data-testid="stDataFrame"]')
    grid = frame.locator('table[role="grid"]')
    expect(grid).to_be_attached(timeout=WAIT)
    scroller = frame.locator(".dvn-scroller")
    seen: dict[int, dict[str, str]] = {}
    while True:
        shown = grid.evaluate(_READ_GRID)
        assert len(shown["header"]) == shown["columns"], f"columns out of view: {shown['header']}"
        for index, cells in shown["rows"]:
            seen[index] = {shown["header"][column]: text for column, text in cells}
        if len(seen) >= shown["count"]:
            break
        last = max(seen)
        scroller.evaluate("e => { e.scrollTop += e.clientHeight; }")
        page.wait_for_function(
            "([grid, last]) => Array.from(grid.querySelectorAll('tbody tr[role=row]'))"
            ".some(tr => Number(tr.getAttribute('aria-rowindex')) > last)",
            arg=[grid.element_handle(), last],
            timeout=WAIT,
        )
    return [seen[index] for index in sorted(seen)]
