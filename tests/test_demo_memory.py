"""The demo's and the app's processes cap glibc's malloc arenas before their first thread.

glibc gives each new thread that allocates an arena of its own until there are 8 per core,
and keeps their pages; MALLOC_ARENA_MAX (or mallopt) read after more than eight exist
changes nothing. The collector's scheduler caps them when it is made, but in `kneepoint
demo` (what ./scripts/run starts) the twin's replicas, HTTP servers and traffic run first:
its process had 16 arenas on 2 cores and grew where `kneepoint collect` stayed flat
(bench/bench_memory.py). These tests count the demo process's arenas with glibc's own
malloc_info, and check that the app's process caps them before Streamlit starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kneepoint import appserver, malloc
from tests.conftest import free_port

# The demo, minus what is not measured here: the backfilled week and the sweeps (minutes of
# CPU, no threads) and the app's process (a child of its own). After `seconds`, SIGALRM in
# the main thread prints the process's malloc arenas (glibc's malloc_info: one <heap nr=…>
# element per arena) and stops the demo as Ctrl-C does.
DEMO = """
import ctypes, os, re, signal, subprocess, sys, tempfile
from pathlib import Path
import kneepoint.demo as demo
import kneepoint.webapp as webapp

folder, seconds, port = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
demo.backfill_week = lambda *args, **kwargs: 0
demo.sweep_runs = lambda fleet: []
webapp.app_process = lambda *args, **kwargs: (
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]), None)
webapp.stop = lambda app, private: app.kill()
libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]

def report(*_):
    out = folder / "malloc_info.xml"
    stream = libc.fopen(str(out).encode(), b"w")
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    print("arenas", len(re.findall("<heap nr=", out.read_text())), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)

signal.signal(signal.SIGALRM, report)
signal.alarm(seconds)
demo.run_demo(folder, "127.0.0.1", port, False, say=lambda _: None)
"""


@pytest.mark.timeout(300)
def test_the_demo_process_keeps_at_most_two_malloc_arenas(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, "-c", DEMO, str(tmp_path), "25", str(free_port())],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,  # no MALLOC_ARENA_MAX: as ./scripts/run starts it
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("arenas ")]
    assert lines, f"no malloc_info report (exit {done.returncode}): {done.stderr[-2000:]}"
    arenas = int(lines[0].split()[1])
    # The twin's 4 replicas, their HTTP servers, the traffic and the collector's jobs all
    # allocated by then: uncapped, each of their threads would have had an arena of its own.
    assert 1 <= arenas <= malloc.ARENAS, f"{arenas} malloc arenas"


def test_the_app_process_caps_arenas_before_streamlit_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[str] = []

    def cap(arenas: int = malloc.ARENAS) -> int:
        events.append("cap")
        return arenas

    monkeypatch.setattr(malloc, "cap_arenas", cap)
    monkeypatch.setattr(appserver, "scrub_log_records", lambda: events.append("scrub"))
    import streamlit.web.cli

    monkeypatch.setattr(streamlit.web.cli, "main", lambda **_: events.append("streamlit"))
    monkeypatch.setattr(sys, "argv", ["appserver"])  # no script: nothing to import first
    appserver.main()
    assert events == ["cap", "scrub", "streamlit"]
