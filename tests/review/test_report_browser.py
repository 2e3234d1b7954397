"""The report from the demo's week in a real Chromium with the network off: it opens, draws
its charts, and asks for nothing beyond its own file."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kneepoint.cli import app
from tests.real.test_browser import browser  # noqa: F401  (a real Chromium)


@pytest.mark.real
def test_the_report_opens_offline_without_errors(
    browser,  # type: ignore[no-untyped-def]  # noqa: F811
    demo_week: tuple[Path, float],
    tmp_path: Path,
) -> None:
    config_file, now = demo_week
    result = CliRunner().invoke(
        app, ["report", "--config", str(config_file), "--out", str(tmp_path), "--at", str(now)]
    )
    assert result.exit_code == 0, result.output
    (report,) = tmp_path.glob("*.html")
    context = browser.new_context(offline=True)
    page = context.new_page()
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on(
        "console", lambda message: errors.append(message.text) if message.type == "error" else None
    )
    try:
        page.goto(report.as_uri())
        page.wait_for_selector(".js-plotly-plot", timeout=30_000)
        assert page.locator(".js-plotly-plot").count() == 3
        assert page.locator("h1").inner_text() == "Weekly capacity review"
        assert "Prefix-cache hits are lost to routing" in page.locator("body").inner_text()
        page.wait_for_timeout(500)
    finally:
        context.close()
    assert not errors, errors
    assert [url for url in requests if not url.startswith("file://")] == []
