"""The CLI starts without what only some commands need: every `kneepoint` command is a fresh
process (cron, CI, the tests run hundreds), and kneed's scipy.signal and scipy.stats were
1 s of its 1.5 s start while only a knee uses them (kneepoint/knee/detect.py imports kneed
where it finds one)."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_cli_loads_no_scipy_and_a_knee_still_loads_kneed() -> None:
    probe = (
        "import sys, kneepoint.cli\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('scipy', 'kneed')))\n"
        "from kneepoint.knee.detect import knee\n"
        "from kneepoint.knee.runs import Point\n"
        "ladder = [Point(c, float(min(c, 8) * 100)) for c in (1, 2, 4, 8, 16, 32)]\n"
        "print(knee(ladder), 'kneed' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    loaded, found = done.stdout.splitlines()
    assert loaded == "[]", f"importing kneepoint.cli loaded {loaded}"
    assert found == "8 True"
