"""The app's process: Streamlit, with kneepoint's log scrubbing from its first line, and the
app's modules imported before it listens.

`kneepoint serve` and `kneepoint demo` start `python -m kneepoint.appserver run app/main.py
…` (kneepoint/webapp.py) instead of `python -m streamlit`: every log record of the process
is scrubbed (kneepoint/secrets.py `scrub_log_records`; Streamlit's and uvicorn's loggers
write through handlers of their own, which a root handler would not reach), and the config
is read first, so its secrets are known to `scrub` before Streamlit logs anything. A config
that does not load is left to the app's pages to report, as with `streamlit run`.

Streamlit imports nothing of an app until a session runs its script, so the first visitor
after a start would wait for pandas, Plotly, SQLAlchemy and kneepoint's kernel to load. The
modules the entry script and the scripts beside it import (app/ and app/screens/) are
imported here instead, before Streamlit starts: the health check answers once they are.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from kneepoint import malloc
from kneepoint.secrets import scrub_log_records


def imported_modules(source: str) -> Iterator[str]:
    """The absolute modules a script's top-level import statements name: `import a.b` gives
    a.b, `from a import b, c` gives a, a.b and a.c (b or c may be a submodule)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "__future__":
                continue
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def app_modules(entry: Path) -> list[str]:
    """Every module the entry script and the scripts in its folder (and below) import."""
    names: set[str] = set()
    for script in sorted(entry.parent.rglob("*.py")):
        with contextlib.suppress(OSError, SyntaxError, ValueError):
            names.update(imported_modules(script.read_text(encoding="utf-8")))
    return sorted(names)


def warm(entry: Path) -> list[str]:
    """Import what the app's scripts import; return the modules imported. A name that is not
    a module (`from a import function`) or fails to import is passed over: the page that
    imports it reports its error as it would have."""
    done = []
    # app.data's @st.cache_data functions, decorated before Streamlit's runtime exists, log
    # "No runtime found" once each; their caches still use the runtime's storage when called
    # (streamlit/runtime/caching/cache_data_api.py: the storage is looked up per call).
    importlib.import_module("streamlit.runtime.caching")  # its logger made, its level set
    caching = logging.getLogger("streamlit.runtime.caching.cache_data_api")
    level = caching.level
    caching.setLevel(logging.ERROR)
    try:
        for name in app_modules(entry):
            try:
                importlib.import_module(name)
            except Exception:  # see the docstring
                continue
            done.append(name)
    finally:
        caching.setLevel(level)
    return done


def entry_script(argv: list[str]) -> Path | None:
    """The script of `… run SCRIPT …`, if it is a file."""
    if len(argv) > 2 and argv[1] == "run" and Path(argv[2]).is_file():
        return Path(argv[2])
    return None


def main() -> None:
    # Before Streamlit's threads (its event loop, each session's script runner, the warmer)
    # allocate: the app's process otherwise keeps up to 8 malloc arenas per core, as the
    # demo's did (7 on 2 cores after its start); the image sets MALLOC_ARENA_MAX=2 for every
    # process, this gives `kneepoint serve` and the demo's app the same on every launch path.
    malloc.cap_arenas()
    scrub_log_records()
    from kneepoint.config import ConfigError, load_config

    with contextlib.suppress(ConfigError):  # the app's pages say what is wrong with it
        load_config(os.environ.get("KNEEPOINT_CONFIG"))  # its Secrets are remembered
    entry = entry_script(sys.argv)
    if entry is not None:
        warm(entry)
    from streamlit.web.cli import main as streamlit

    streamlit(prog_name="streamlit")


if __name__ == "__main__":
    main()
