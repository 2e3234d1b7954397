"""kneepoint/appserver.py imports what the app's scripts import before Streamlit starts, so the
first session after a start does not wait for the imports."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from kneepoint.appserver import entry_script, imported_modules

ROOT = Path(__file__).resolve().parents[2]


def test_a_scripts_import_statements_name_its_modules() -> None:
    source = textwrap.dedent(
        """
        from __future__ import annotations
        import os.path, json
        from app import data, filters
        from .near import thing
        if True:
            import later  # not at the top level: not imported up front
        """
    )
    assert list(imported_modules(source)) == [
        "os.path",
        "json",
        "app",
        "app.data",
        "app.filters",
    ]


def test_the_entry_script_is_the_one_streamlit_runs(tmp_path: Path) -> None:
    script = tmp_path / "main.py"
    script.write_text("")
    assert entry_script(["streamlit", "run", str(script), "--server.port", "1"]) == script
    assert entry_script(["streamlit", "run", str(tmp_path / "none.py")]) is None
    assert entry_script(["streamlit", "version"]) is None


def test_the_app_s_modules_are_imported_before_streamlit_starts() -> None:
    """In a fresh interpreter: when Streamlit's command line is called, the modules the
    pages import are loaded already, quietly, and no page script has run."""
    child = textwrap.dedent(
        """
        import sys
        import streamlit.web.cli

        def streamlit_main(prog_name):
            wanted = ["app.data", "app.tables", "dashboards.charts", "plotly.graph_objects",
                      "pandas", "kneepoint.whatif", "review.effects"]
            print("loaded", [name for name in wanted if name in sys.modules])
            print("pages", [name for name in sys.modules if name.startswith("app.screens")])

        streamlit.web.cli.main = streamlit_main
        from kneepoint import appserver

        sys.argv = ["appserver", "run", "app/main.py", "--server.port", "1"]
        appserver.main()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", child],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "KNEEPOINT_CONFIG": str(ROOT / "none.yaml")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "loaded ['app.data', 'app.tables', 'dashboards.charts', 'plotly.graph_objects', "
        "'pandas', 'kneepoint.whatif', 'review.effects']" in done.stdout
    ), done.stdout + done.stderr[-3000:]
    assert "pages []" in done.stdout
    assert "No runtime found" not in done.stderr, done.stderr[-3000:]
