"""The canary test: every secret field of a config holds a unique canary string, and no
canary turns up anywhere kneepoint writes: what each command prints, the log, every column
of every table, the weekly report, every page of the app in Chromium (its text, its HTML and
every frame the server sent it), and every message the loopback platforms received, except
where the platform itself needs the secret (the URL it was sent to, the header it checks,
PagerDuty's routing_key).

The config uses every channel type, each at a loopback receiver (some answer errors, two
echo what they were sent back, so stored errors are made of what a platform wrote), a
channel whose receiver is gone, targets with `user:canary@` and `?token=canary` in their
URLs and canary headers (one up, one refusing connections, one answering 503), a heartbeat,
a Prometheus source, a PostgreSQL database whose password is a canary, and an `auth:`
section with every secret it has: an OIDC client secret and cookie secret (in mode none,
as the Streamlit app's secrets file carries them without a provider to sign in at) and an
API token. Each canary but the two OIDC ones is also shown to have been used: the
platforms got their tokens and valid signatures, the targets their credentials, the
annotation API took the token, and the database refuses any other password. Also searched:
the Grafana dashboards and Prometheus rules `kneepoint export grafana` / `alerts export`
write, and the log of `kneepoint serve`, which holds the Streamlit process's log too."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets as random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Set
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from alerts.channels.dingtalk import dingtalk_sign
from alerts.channels.feishu import feishu_sign
from app.registry import PAGES
from tests.conftest import (
    DCGM_T4,
    VLLM_032,
    Route,
    free_port,
    require_real,
    serving_metrics,
    wait_until_healthy,
)
from tests.postgres import running_postgres
from tests.real.test_browser import settled

PREFIX = "kpcanary"
CHROMIUM = "/usr/bin/chromium"
COMMAND_SECONDS = 120
AT_ONCE = 4  # commands run at the same time (run_each): two cores, and some time is waiting
CHANNELS = (  # every channel type, and a webhook whose receiver is gone
    "slack",
    "discord",
    "teams",
    "feishu",
    "dingtalk",
    "wecom",
    "telegram",
    "pagerduty",
    "webhook",
    "alertmanager",
    "gone",
)
# Every secret field the config below fills, each with its own canary.
FIELDS = (
    "db_password",
    "target_password",
    "target_query",
    "target_header",
    "gpu_query",
    "gpu_header",
    "down_password",
    "down_query",
    "broken_query",
    "slack",
    "discord",
    "teams_sig",
    "feishu",
    "feishu_secret",
    "dingtalk",
    "dingtalk_secret",
    "wecom",
    "telegram",
    "pagerduty",
    "pagerduty_header",
    "webhook",
    "webhook_secret",
    "webhook_header",
    "alertmanager_password",
    "alertmanager_header",
    "gone_path",
    "gone_query",
    "heartbeat",
    "prometheus_password",
    "prometheus_header",
    "wrong_db_password",
    "oidc_client_secret",
    "oidc_cookie_secret",
    "api_token",
)


@dataclass
class Got:
    method: str
    path: str  # with its query
    headers: dict[str, str]
    body: bytes


@dataclass
class Platforms:
    """The chat platforms, PagerDuty, Alertmanager, the heartbeat receiver and a Prometheus
    on one loopback server; each answers by the start of its path (`answers`)."""

    port: int = 0
    got: list[Got] = field(default_factory=list)
    answers: dict[str, Callable[[Got], tuple[int, bytes]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def requests(self, start: str) -> list[Got]:
        with self.lock:
            return [g for g in self.got if g.path.startswith(start)]


@contextmanager
def platforms() -> Iterator[Platforms]:
    state = Platforms()

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            got = Got(self.command, self.path, dict(self.headers.items()), body)
            with state.lock:
                state.got.append(got)
            answer = next(
                (a for start, a in state.answers.items() if self.path.startswith(start)),
                lambda _: (200, b'{"code": 0, "errcode": 0, "ok": true}'),
            )
            status, reply = answer(got)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        do_GET = do_POST = _handle

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def leaks(where: str, text: str, c: dict[str, str], allowed: Set[str] = frozenset()) -> list[str]:
    """Each canary in `text` but the `allowed` ones (whole, or its random part alone, or
    just the prefix: a cut one), said with where it was."""
    for name in allowed:
        text = text.replace(c[name], "<allowed>")
    found = []
    for name, value in c.items():
        if value.removeprefix(PREFIX) in text:
            at = text.find(value.removeprefix(PREFIX))
            found.append(f"{where}: {name} in …{text[max(0, at - 80) : at + 40]!r}…")
    if PREFIX in text and not found:
        at = text.find(PREFIX)
        found.append(f"{where}: {PREFIX} in …{text[max(0, at - 80) : at + 40]!r}…")
    return found


def kneepoint(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kneepoint.cli", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=COMMAND_SECONDS,
        check=False,
    )


def write_config(folder: Path, c: dict[str, str], database: str, targets: int, hub: int) -> Path:
    """The config with a canary in every secret field (`c`), targets on port `targets`,
    the platforms on port `hub`."""
    closed = free_port()  # nothing listens there: refused connections
    local = f"127.0.0.1:{hub}"
    channels = {
        "slack": f"{{type: slack, url: 'http://{local}/slack/services/T0/B0/{c['slack']}'}}",
        "discord": f"{{type: discord, url: 'http://{local}/api/webhooks/1234/{c['discord']}'}}",
        "teams": f"{{type: teams, url: 'http://{local}/teams/workflows/abc/triggers/manual/"
        f"paths/invoke?api-version=2016-06-01&sp=%2Ftriggers&sig={c['teams_sig']}'}}",
        "feishu": f"{{type: feishu, url: 'http://{local}/open-apis/bot/v2/hook/{c['feishu']}',"
        f" secret: '{c['feishu_secret']}'}}",
        "dingtalk": f"{{type: dingtalk, url: 'http://{local}/robot/send?access_token="
        f"{c['dingtalk']}', secret: '{c['dingtalk_secret']}'}}",
        "wecom": f"{{type: wecom, url: 'http://{local}/cgi-bin/webhook/send?key={c['wecom']}'}}",
        "telegram": f"{{type: telegram, url: 'http://{local}/tg', token: '1234:{c['telegram']}',"
        " chat_id: '-100200'}",
        "pagerduty": f"{{type: pagerduty, url: 'http://{local}/pd', routing_key:"
        f" '{c['pagerduty']}', headers: {{X-Routing-Check: '{c['pagerduty_header']}'}}}}",
        "webhook": f"{{type: webhook, url: 'http://{local}/hook/{c['webhook']}', secret:"
        f" '{c['webhook_secret']}', headers: {{Authorization: 'Bearer {c['webhook_header']}'}}}}",
        "alertmanager": f"{{type: alertmanager, url: 'http://kp:{c['alertmanager_password']}@"
        f"{local}/am', headers: {{X-Scope-OrgID: '{c['alertmanager_header']}'}}}}",
        "gone": f"{{type: webhook, url: 'http://127.0.0.1:{closed}/gone/{c['gone_path']}"
        f"?token={c['gone_query']}'}}",
    }
    assert tuple(channels) == CHANNELS
    listed = "\n".join(f"  - {{name: {name}, {spec[1:]}" for name, spec in channels.items())
    here = f"127.0.0.1:{targets}"
    config = folder / "kneepoint.yaml"
    config.write_text(
        f"""
database: "{database}"
scrape_interval: 2s
evaluation_interval: 2s
targets:
  - {{name: replica-a, kind: vllm, gpus: ["cp-bm14r7/0"], timeout: 2s,
     url: "http://scraper:{c["target_password"]}@{here}/a?token={c["target_query"]}",
     headers: {{X-Api-Key: "{c["target_header"]}"}}}}
  - {{name: gpu-node, kind: dcgm, timeout: 2s, url: "http://{here}/gpus?key={c["gpu_query"]}",
     headers: {{Authorization: "Bearer {c["gpu_header"]}"}}}}
  - {{name: replica-down, kind: vllm, timeout: 2s,
     url: "http://scraper:{c["down_password"]}@127.0.0.1:{closed}/m?token={c["down_query"]}"}}
  - {{name: replica-broken, kind: vllm, timeout: 2s,
     url: "http://{here}/broken?token={c["broken_query"]}"}}
channels:
{listed}
rules:
  - {{name: canary-down, metric: up, op: "<", threshold: 1, for: 0s, severity: page,
     channels: [{", ".join(channels)}]}}
heartbeat: {{url: "http://{local}/hb/{c["heartbeat"]}", interval: 2s}}
report: {{output_dir: "{folder / "reports"}"}}
auth:
  mode: none
  anonymous_role: admin
  oidc: {{issuer: "http://127.0.0.1:{closed}/idp", client_id: kneepoint,
         client_secret: "{c["oidc_client_secret"]}", cookie_secret: "{c["oidc_cookie_secret"]}",
         redirect_uri: "http://127.0.0.1:{closed}/oauth2callback"}}
  api_tokens: [{{name: ci, token: "{c["api_token"]}", role: operator}}]
"""
    )
    return config


def echo(got: Got) -> tuple[int, bytes]:
    """What a careless platform answers: its error quotes the request back."""
    return 400, b"bad request " + got.path.encode() + b" " + got.body[:300]


ANSWERS: dict[str, Callable[[Got], tuple[int, bytes]]] = {
    "/slack/": lambda got: (404, b"no_service " + got.path.encode()),
    "/api/webhooks/": lambda got: (500, b"internal error at " + got.path.encode()),  # retried
    "/robot/send": lambda got: (
        200,
        json.dumps({"errcode": 310000, "errmsg": f"sign not match: {got.path}"}).encode(),
    ),
    "/cgi-bin/webhook/send": lambda got: (
        200,
        json.dumps({"errcode": 93000, "errmsg": f"invalid webhook url {got.path}"}).encode(),
    ),
    "/pd": echo,
    "/hb/": lambda got: (503, b"check paused " + got.path.encode()),
    "/prom/": lambda got: (
        401,
        b"unauthorized: org "
        + got.headers.get("X-Scope-OrgID", "").encode()
        + b" with "
        + got.headers.get("Authorization", "").encode()
        + b" at "
        + got.path.encode(),
    ),
}


def open_browser():  # type: ignore[no-untyped-def]
    if not Path(CHROMIUM).exists() or shutil.which("chromium") is None:
        require_real(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require_real("the playwright Python package is not installed")
    return sync_playwright()


@pytest.mark.real
@pytest.mark.timeout(900)
def test_no_canary_appears_anywhere(tmp_path: Path) -> None:
    c = {name: f"{PREFIX}{random.token_hex(8)}" for name in FIELDS}
    found: list[str] = []  # every leak, with where it was
    outputs: dict[str, str] = {}  # what each command printed, by command

    def run(label: str, *args: str, config: Path, codes: tuple[int, ...] = (0,)) -> str:
        done = kneepoint(*args, config=config)
        text = done.stdout + done.stderr
        outputs[label] = text
        assert done.returncode in codes, f"{label}: exit {done.returncode}: {text[-3000:]}"
        return text

    def run_each(commands: dict[str, tuple[tuple[str, ...], Path, tuple[int, ...]]]) -> None:
        """Commands that do not depend on each other's effects, AT_ONCE at a time: each is a
        process of its own that spends seconds importing kneepoint, one core's work; one
        after another, the second core idled. Their outputs are kept and checked as `run`'s."""
        with ThreadPoolExecutor(AT_ONCE) as pool:
            done = [
                pool.submit(run, label, *args, config=config, codes=codes)
                for label, (args, config, codes) in commands.items()
            ]
            for future in done:
                future.result()  # a command's failed assertion fails the test here

    with running_postgres() as fresh, platforms() as hub, serving_metrics() as targets:
        database = fresh(password=c["db_password"])
        hub.answers = ANSWERS
        targets.routes = {
            f"/a?token={c['target_query']}": Route(VLLM_032.read_bytes()),
            f"/gpus?key={c['gpu_query']}": Route(DCGM_T4.read_bytes()),
            f"/broken?token={c['broken_query']}": Route(b"upstream down", status=503),
        }
        config = write_config(tmp_path, c, database, targets.port, hub.port)

        # The commands, as a user runs them.
        run("migrate", "migrate", config=config)
        collected = run("collect --once", "collect", "--once", config=config)
        assert "replica-a: up" in collected and "replica-down: down" in collected
        assert "replica-broken: down: HTTP 503 from http://127.0.0.1:" in collected
        fired = run("alerts eval", "alerts", "eval", "--once", config=config)
        assert "canary-down on replica-down" in fired, fired
        # Each channel's test message (its own outbox row, sent by its own command), then
        # the commands that read: each batch at once (run_each).
        run_each(
            {
                f"alerts test {name}": (("alerts", "test", "--channel", name), config, (0, 1))
                for name in CHANNELS
            }
        )
        run_each(
            {
                label: (args, config, (0,))
                for label, args in {
                    "alerts list": ("alerts", "list"),
                    "alerts list --json": ("alerts", "list", "--json"),
                    "alerts export": ("alerts", "export", "--format", "prometheus"),
                    "status": ("status",),
                    "status --json": ("status", "--json"),
                    "knee": ("knee",),
                    "knee --json": ("knee", "--json"),
                    "audit": ("audit",),
                    "audit --json": ("audit", "--json"),
                    "report": ("report", "--out", str(tmp_path / "reports")),
                    "export grafana": ("export", "grafana", "--out", str(tmp_path / "grafana")),
                }.items()
            }
        )

        # The scheduled collector, until the heartbeat has been tried: its log is stderr.
        log = tmp_path / "collect.log"
        with log.open("w") as sink:
            collector = subprocess.Popen(
                [sys.executable, "-m", "kneepoint.cli", "collect", "--config", str(config)],
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
            try:
                deadline = time.monotonic() + 120
                while not hub.requests("/hb/") and time.monotonic() < deadline:
                    assert collector.poll() is None, log.read_text()
                    time.sleep(0.2)
            finally:
                collector.terminate()
                collector.wait(timeout=30)
        outputs["collect (scheduled)"] = log.read_text()
        assert hub.requests("/hb/"), "the heartbeat never beat: " + log.read_text()[-2000:]
        run_each(  # the heartbeat job failed: health may say so with exit code 1
            {
                "health": (("health",), config, (0, 1)),
                "health --json": (("health", "--json"), config, (0, 1)),
            }
        )

        # The Prometheus source, and a database password that is wrong.
        prometheus = tmp_path / "prometheus.yaml"
        prometheus.write_text(
            config.read_text()
            + f"prometheus: {{url: 'http://reader:{c['prometheus_password']}@127.0.0.1:"
            f"{hub.port}/prom', headers: {{X-Scope-OrgID: '{c['prometheus_header']}'}}}}\n"
        )
        wrong = tmp_path / "wrong.yaml"
        wrong.write_text(config.read_text().replace(c["db_password"], c["wrong_db_password"]))
        run_each(
            {
                "collect --once (prometheus)": (("collect", "--once"), prometheus, (1,)),
                **{
                    f"{command} (wrong password)": ((command,), wrong, (1,))
                    for command in ("migrate", "status", "health")
                },
            }
        )
        refused = outputs["collect --once (prometheus)"]
        assert "cannot read http://***@127.0.0.1:" in refused and "401" in refused, refused
        for command in ("migrate", "status", "health"):
            said = outputs[f"{command} (wrong password)"]
            assert "password authentication failed" in said, said

        # Every page in Chromium as the local admin, with the app's own collectors running.
        port, api_port = free_port(), free_port()
        serve_log = tmp_path / "serve.log"
        pages: dict[str, str] = {}
        with serve_log.open("w") as sink:
            server = subprocess.Popen(
                [sys.executable, "-m", "kneepoint.cli", "serve", "--config", str(config),
                 "--port", str(port), "--no-browser", "--api-port", str(api_port)],
                stdout=sink,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                url = f"http://127.0.0.1:{port}"
                wait_until_healthy(server, f"{url}/_stcore/health", 90, serve_log.read_text)
                annotations = f"http://127.0.0.1:{api_port}/api/v1/annotations"
                for token in (c["api_token"], "not-the-token-" + c["api_token"][::-1]):
                    posted = httpx.post(
                        annotations,
                        json={"text": "canary deploy"},
                        headers={"Authorization": f"Bearer {token}"},
                        timeout=30,
                    )
                    assert posted.status_code == (201 if token == c["api_token"] else 401), (
                        posted.text
                    )
                pages = read_pages(url)
            finally:
                server.terminate()
                server.wait(timeout=30)
        outputs["serve (log)"] = serve_log.read_text()

        # Where the canaries went: they were used ...
        check_used(c, hub, targets, database)
        # ... and nowhere else.
        for label, text in outputs.items():
            found += leaks(f"output of `kneepoint {label}`", text, c)
        for label, text in pages.items():
            found += leaks(label, text, c)
        for folder in ("reports", "grafana"):
            for path in sorted((tmp_path / folder).rglob("*")):
                if path.is_file():
                    text = path.read_text(errors="replace")
                    found += leaks(f"{folder} file {path.name}", text, c)
        found += database_leaks(database, c)
        found += message_leaks(hub, c)

    assert not found, "canaries leaked:\n" + "\n".join(found)
    assert any(p.endswith(".html") for p in map(str, (tmp_path / "reports").rglob("*")))
    assert any((tmp_path / "grafana").glob("*.json"))
    assert "groups:" in outputs["alerts export"]  # the Prometheus rules were printed
    # What collect says it writes into: the database, its user info masked.
    assert "into postgresql+psycopg://***@127.0.0.1:" in outputs["collect (scheduled)"]


def read_pages(url: str) -> dict[str, str]:
    """Each page's text, HTML and every websocket frame the server sent it (a table's
    cells are drawn on a canvas: they are only in the frames), by where."""
    seen: dict[str, str] = {}
    with open_browser() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            for spec in PAGES:
                frames: list[str] = []
                page = browser.new_page()

                def keep(socket, frames: list[str] = frames) -> None:  # type: ignore[no-untyped-def]
                    socket.on(
                        "framereceived",
                        lambda payload: frames.append(
                            payload.decode("utf-8", "replace")
                            if isinstance(payload, bytes)
                            else payload
                        ),
                    )

                page.on("websocket", keep)
                path = "" if spec == PAGES[0] else spec.url_path
                page.goto(f"{url}/{path}")
                page.wait_for_selector("h1", timeout=60_000)
                page.wait_for_load_state("networkidle")
                settled(page)  # the run is over: every frame it sent has come
                assert page.locator("h1").first.inner_text().strip() == spec.title
                seen[f"page {spec.url_path} (text)"] = page.locator("body").inner_text()
                seen[f"page {spec.url_path} (HTML)"] = page.content()
                seen[f"page {spec.url_path} (frames)"] = "\n".join(frames)
                page.close()
        finally:
            browser.close()
    # The frames are what the pages were drawn from: the health page's table of targets
    # (a canvas) is in them, with its URLs.
    assert "/a?token=" in seen["page health (frames)"], "the frames hold no table cells"
    return seen


def check_used(c: dict[str, str], hub: Platforms, targets, database: str) -> None:  # type: ignore[no-untyped-def]
    """Each canary reached the one place that needs it: the test cannot pass by sending
    nothing."""
    # The targets got their credentials (user info as Basic auth, the query, the headers).
    basic = "Basic " + base64.b64encode(f"scraper:{c['target_password']}".encode()).decode()
    got_a = targets.headers[f"/a?token={c['target_query']}"]
    assert got_a["Authorization"] == basic and got_a["X-Api-Key"] == c["target_header"]
    got_gpus = targets.headers[f"/gpus?key={c['gpu_query']}"]
    assert got_gpus["Authorization"] == f"Bearer {c['gpu_header']}"
    assert targets.hits[f"/broken?token={c['broken_query']}"] >= 1
    # Every platform got messages at its secret URL, signed with its secret.
    for start in (
        f"/slack/services/T0/B0/{c['slack']}",
        f"/api/webhooks/1234/{c['discord']}",
        "/teams/workflows/abc/triggers/manual/paths/invoke?",
        f"/open-apis/bot/v2/hook/{c['feishu']}",
        f"/robot/send?access_token={c['dingtalk']}&timestamp=",
        f"/cgi-bin/webhook/send?key={c['wecom']}",
        f"/tg/bot1234:{c['telegram']}/sendMessage",
        "/pd",
        f"/hook/{c['webhook']}",
        "/am/api/v2/alerts",
        f"/hb/{c['heartbeat']}",
        "/prom/api/v1/query",
    ):
        assert hub.requests(start), f"nothing reached {start}"
    assert all(c["teams_sig"] in g.path for g in hub.requests("/teams/"))
    for got in hub.requests("/open-apis/"):
        body = json.loads(got.body)
        assert body["sign"] == feishu_sign(int(body["timestamp"]), c["feishu_secret"])
    for got in hub.requests("/robot/send"):
        query = dict(pair.split("=", 1) for pair in urlsplit(got.path).query.split("&"))
        assert query["sign"] == dingtalk_sign(int(query["timestamp"]), c["dingtalk_secret"])
    for got in hub.requests("/hook/"):
        digest = hmac.new(c["webhook_secret"].encode(), got.body, hashlib.sha256).hexdigest()
        assert got.headers["X-Kneepoint-Signature"] == f"sha256={digest}"
        assert got.headers["Authorization"] == f"Bearer {c['webhook_header']}"
    for got in hub.requests("/pd"):
        assert json.loads(got.body)["routing_key"] == c["pagerduty"]
        assert got.headers["X-Routing-Check"] == c["pagerduty_header"]
    am_basic = base64.b64encode(f"kp:{c['alertmanager_password']}".encode()).decode()
    for got in hub.requests("/am/"):
        assert got.headers["Authorization"] == f"Basic {am_basic}"
        assert got.headers["X-Scope-OrgID"] == c["alertmanager_header"]
    for got in hub.requests("/prom/"):
        assert got.headers["X-Scope-OrgID"] == c["prometheus_header"]
        prom_basic = base64.b64encode(f"reader:{c['prometheus_password']}".encode()).decode()
        assert got.headers["Authorization"] == f"Basic {prom_basic}"
    # The database is the one that takes only its password.
    import psycopg
    from sqlalchemy import create_engine, text

    engine = create_engine(database)
    try:
        with engine.connect() as connection:
            assert connection.scalar(text("SELECT count(*) FROM targets")) == 4
    finally:
        engine.dispose()
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(database.replace("postgresql+psycopg", "postgresql").replace(
            c["db_password"], c["wrong_db_password"]))  # fmt: skip


def database_leaks(database: str, c: dict[str, str]) -> list[str]:
    """Every value of every row of every table, as text."""
    from sqlalchemy import MetaData, create_engine, select

    engine = create_engine(database)
    found: list[str] = []
    try:
        metadata = MetaData()
        metadata.reflect(engine)
        with engine.connect() as connection:
            for table in metadata.sorted_tables:
                values = []
                for row in connection.execute(select(table)):
                    for value in row:
                        if isinstance(value, bytes | memoryview):
                            values.append(bytes(value).decode("latin-1"))
                        elif value is not None:
                            values.append(str(value))
                found += leaks(f"table {table.name}", "\n".join(values), c)
        assert "targets" in metadata.tables and "notifications" in metadata.tables
    finally:
        engine.dispose()
    return found


# Where each platform's own secrets may be in what it received: the URL it was sent to, the
# headers it checks (configured by the user for it), and PagerDuty's routing_key field.
OWN = {
    "/slack/": ({"slack"}, set()),
    "/api/webhooks/": ({"discord"}, set()),
    "/teams/": ({"teams_sig"}, set()),
    "/open-apis/": ({"feishu"}, set()),
    "/robot/send": ({"dingtalk"}, set()),
    "/cgi-bin/webhook/send": ({"wecom"}, set()),
    "/tg/": ({"telegram"}, set()),
    "/pd": (set(), {"pagerduty_header"}),
    "/hook/": ({"webhook"}, {"webhook_header"}),
    "/am/": (set(), {"alertmanager_header"}),
    "/hb/": ({"heartbeat"}, set()),
    "/prom/": (set(), {"prometheus_header"}),
}


def message_leaks(hub: Platforms, c: dict[str, str]) -> list[str]:
    """What the platforms received: no canary in a body (PagerDuty's routing_key field
    aside), and in the path and headers only the platform's own."""
    found: list[str] = []
    with hub.lock:
        received = list(hub.got)
    assert received
    for got in received:
        start = next(s for s in OWN if got.path.startswith(s))
        in_path, in_headers = OWN[start]
        body = got.body.decode("utf-8", "replace")
        if start == "/pd":
            message = json.loads(body)
            assert message.pop("routing_key") == c["pagerduty"]
            body = json.dumps(message)
        where = f"message to {start}"
        found += leaks(f"{where} (body)", body, c)
        found += leaks(f"{where} (path)", got.path, c, in_path)
        headers = "\n".join(f"{k}: {v}" for k, v in got.headers.items())
        found += leaks(f"{where} (headers)", headers, c, in_headers)
        assert not parse_qs(urlsplit(got.path).query).get("password")
    return found
