"""Time is passed in, never read deep inside logic, so tests can move it."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]
system_clock: Clock = time.time
