"""A real OpenID Connect provider for the sign-in tests: panva's certified `oidc-provider`
(npm) run by Node, from tests/real/oidc. Its packages are installed outside the checkout by
scripts/setup-oidc-provider (scripts/setup runs it in CI; here it runs on first use).

The provider knows one confidential client and three accounts (tests/real/oidc/provider.mjs):
viewer@example.com (groups: readers), operator@example.com (oncall), admin@example.com
(sre-leads, oncall) and stranger@example.org (oncall, another domain); its login form takes
any password. Its ID tokens carry e-mail and
groups; it requires PKCE (S256) for every authorization code.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, require_real

PROVIDER_DIR = ROOT / "tests" / "real" / "oidc"
SETUP = ROOT / "scripts" / "setup-oidc-provider"
OLDEST_NODE = (18, 12)  # oidc-provider 8.x


@dataclass
class OidcProvider:
    issuer: str
    client_id: str
    client_secret: str
    redirect_uri: str
    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)  # everything it printed, in order

    @property
    def metadata_url(self) -> str:
        return f"{self.issuer}/.well-known/openid-configuration"

    def signed_in(self) -> list[str]:
        """The accounts signed in through its login form, in order (its own log lines)."""
        return [line.split()[-1] for line in list(self.lines) if line.startswith("signed in ")]

    def log(self) -> str:
        return "\n".join(self.lines)


def installed_packages() -> Path:
    """The folder whose node_modules holds oidc-provider (installed on first use)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        require_real("no node/npm for the OpenID Connect provider (apt-get install nodejs npm)")
    assert node is not None
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    found = tuple(int(part) for part in re.findall(r"\d+", version.stdout)[:2])
    if found < OLDEST_NODE:
        require_real(f"node {version.stdout.strip()} is older than oidc-provider needs (18.12)")
    setup = subprocess.run([str(SETUP)], capture_output=True, text=True, timeout=600)
    if setup.returncode != 0:
        require_real(f"scripts/setup-oidc-provider failed: {setup.stderr.strip()[-2000:]}")
    folder = Path(setup.stdout.strip().splitlines()[-1])
    if not (folder / "node_modules" / "oidc-provider" / "package.json").is_file():
        require_real(f"oidc-provider is not installed under {folder}")
    return folder


# How long one start may stay silent before it is stopped and tried again (it prints its
# line in about a second here; once in CI it printed nothing for 180 s on a quiet machine,
# and the same test alone then passed in 34 s).
START_SECONDS = 90
STARTS = 2


def _start(
    script: Path, workdir: Path, client_id: str, redirect_uri: str, client_secret: str
) -> tuple[subprocess.Popen[str], list[str], threading.Thread, bool]:
    """One start of the provider: (process, its output lines, their reader, whether it said
    it listens within START_SECONDS)."""
    process = subprocess.Popen(
        [
            "node",
            str(script),
            "--port",
            "0",
            "--client-id",
            client_id,
            "--redirect-uri",
            redirect_uri,
        ],
        cwd=workdir,
        env={**os.environ, "OIDC_CLIENT_SECRET": client_secret},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    listening = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("listening "):
                listening.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + START_SECONDS
    while not listening.wait(0.2):
        if process.poll() is not None or time.monotonic() > deadline:
            return process, lines, reader, False
    return process, lines, reader, True


def _stop(process: subprocess.Popen[str], reader: threading.Thread) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    reader.join(timeout=5)


@contextmanager
def running_provider(
    workdir: Path, redirect_uri: str, client_id: str, client_secret: str
) -> Iterator[OidcProvider]:
    """Start the provider on a free loopback port (it picks one and says which), wait until
    its discovery document answers, and stop it when the block ends. A start that says
    nothing within START_SECONDS is stopped and tried again, STARTS times in all; then the
    test fails with what each start printed."""
    packages = installed_packages()
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / "provider.mjs"
    shutil.copyfile(PROVIDER_DIR / "provider.mjs", script)
    (workdir / "node_modules").symlink_to(packages / "node_modules", target_is_directory=True)
    failed: list[str] = []
    for attempt in range(1, STARTS + 1):
        process, lines, reader, started = _start(
            script, workdir, client_id, redirect_uri, client_secret
        )
        if started:
            break
        code = process.poll()
        _stop(process, reader)
        state = f"exited {code}" if code is not None else f"silent for {START_SECONDS} s"
        failed.append(f"start {attempt} ({state}):\n" + "\n".join(lines))
    else:
        pytest.fail("the OpenID Connect provider did not start:\n" + "\n".join(failed))
    try:
        deadline = time.monotonic() + START_SECONDS
        issuer = next(line.split()[1] for line in lines if line.startswith("listening "))
        provider = OidcProvider(issuer, client_id, client_secret, redirect_uri, process, lines)
        while True:  # the line comes once it listens; the document proves it answers
            try:
                answer = httpx.get(provider.metadata_url, timeout=5)
                if answer.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{provider.metadata_url} never answered:\n{provider.log()}")
            time.sleep(0.2)
        assert answer.json()["issuer"] == issuer
        yield provider
    finally:
        _stop(process, reader)
