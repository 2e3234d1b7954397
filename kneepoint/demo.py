"""`kneepoint demo`: the embedded default. A twin fleet, agent traffic, a backfilled week,
the collectors and the app, in one command that Ctrl-C stops cleanly."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from collectors.jobs import install, standard_jobs
from collectors.scheduler import StepSafeBackgroundScheduler
from kneepoint import malloc
from kneepoint.config import load_config
from kneepoint.knee.runs import Run
from kneepoint.store.db import open_store
from kneepoint.store.runs import save_run
from kneepoint.twin.backfill import Overload, Sleep, backfill_week
from kneepoint.twin.fleet import Fleet, FleetSpec
from kneepoint.twin.ladder import ladder_run
from kneepoint.twin.traffic import Group, Traffic
from kneepoint.webapp import app_process, check_listen
from kneepoint.webapp import stop as stop_app

# Four replicas on two GPU nodes, of two engines: two vLLM Llama-3.1-8B behind session-sticky
# routing (one with a small GPU KV cache extended by a CPU KV offload tier, so its prefix
# cache evicts and the tier serves hits; one with a speculative drafter, put to sleep each
# night while the other serves), and Qwen3-4B on two L4s, served by vLLM on one (it runs near
# KV saturation at its peak and preempts, and sheds load past its queue limit in its overload
# episode) and by SGLang on the other (a mixed-engine pool).
#
# Why the offload tier is not on the L4: there it relieves the very KV bound the weekly review
# reports. A preempted request reloads its prompt from the tier over PCIe instead of
# recomputing it, so the thrash after a preemption stops (a week: 75,000 preemptions and 12 %
# of prefill recomputed without the tier, 9,500 and 1.6 % with 16 GiB; peak KV 85 % either
# way) and the review rightly no longer finds the KV cache the limit. That is the tier's
# honest physics (vLLM's offloading does exactly this), not an accounting error: offloaded
# blocks count neither in the device's KV occupancy nor in preemptions.
FLEET = {
    "nodes": [
        {"name": "gpu-node-1", "gpus": ["h100-80gb", "h100-80gb"]},
        {"name": "gpu-node-2", "gpus": ["l4", "l4"]},
    ],
    "replicas": [
        {
            "name": "llama-8b-a",
            "model": "llama-3.1-8b",
            "node": "gpu-node-1",
            "gpu_index": 0,
            # A small KV cache (the rest of the H100 left to another tenant), so its prefix
            # cache evicts; vLLM's native CPU offload tier serves the evicted prefixes back.
            "gpu_memory_utilization": 0.3,
            "kv_offload_gib": 16.0,
        },
        {
            "name": "llama-8b-b",
            "model": "llama-3.1-8b",
            "node": "gpu-node-1",
            "gpu_index": 1,
            "speculative": {"tokens": 3, "acceptance": 0.7, "draft_cost": 0.08},
        },
        {
            "name": "qwen3-4b-l4",
            "model": "qwen3-4b",
            "node": "gpu-node-2",
            # 0.4 leaves about 1.7 GiB of the L4 for KV: KV-bound at its daily peak. Since
            # the twin admits as vLLM V1 does (the whole prompt must fit: fewer preemptions),
            # 0.5-0.6 recomputed only 1-3.5 % of prefill, under the review's 5 % rule.
            "gpu_memory_utilization": 0.4,
            # Past 32 unfinished requests: HTTP 503. Each agent session has one request in
            # flight, so at its daily peak (19 sessions, ±10 %) the limit never binds and the
            # KV bound stays the limit; in the overload burst (2.5×: about 48) it sheds. At 64
            # the burst never reached the limit: no refusal in the history.
            "max_num_queued_reqs": 32,
        },
        {
            "name": "qwen3-4b-sglang",
            "model": "qwen3-4b",
            "node": "gpu-node-2",
            "gpu_index": 1,
            "engine": "sglang",  # SGLang's newest metrics and API (kind sglang in the config)
            "gpu_memory_utilization": 0.85,  # its --mem-fraction-static
        },
    ],
}
# Agent sessions at the daily peak: history (per replica) and live traffic (per model).
HISTORY_PEAKS = {
    "llama-8b-a": 14.0,
    "llama-8b-b": 14.0,
    "qwen3-4b-l4": 19.0,
    "qwen3-4b-sglang": 14.0,
}
LIVE_PEAKS = {"meta-llama/Llama-3.1-8B-Instruct": 10.0, "Qwen/Qwen3-4B": 12.0}
LIVE_DAY_SECONDS = 1800.0  # one day of the daily load shape every 30 minutes
# In the history: llama-8b-b sleeps (vLLM sleep level 1) each night from 01:00 to 05:00 UTC
# while llama-8b-a takes its agents; the L4's traffic burst a day ago (2.5 × its load for 45
# minutes) is past its queue limit, so it sheds.
HISTORY_SLEEPS = {"llama-8b-b": Sleep(start_hour=1.0, hours=4.0, level=1, covered_by="llama-8b-a")}
HISTORY_OVERLOADS = {"qwen3-4b-l4": Overload(hours_ago=26.0, hours=0.75, factor=2.5)}
# Live: llama-8b-b sleeps for LIVE_SLEEP[1] seconds from LIVE_SLEEP[0] seconds after the start,
# and again every LIVE_DAY_SECONDS (the traffic is drained from it first, as an operator would).
LIVE_SLEEPER = "llama-8b-b"
LIVE_SLEEP = (600.0, 300.0)


def write_config(folder: Path, fleet: Fleet, rules: list[Any] | None = None) -> Path:
    """The demo's kneepoint.yaml; `rules` (the `rules:` of a config) are added as given and
    validated with the rest when the file is loaded."""
    config: dict[str, Any] = {
        "database": f"sqlite:///{folder / 'kneepoint.db'}",
        "scrape_interval": "5s",
        "evaluation_interval": "15s",
        "dashboard_url": "http://localhost:8501",
        "targets": [
            # The twin's own loopback URLs, written into the demo's config file.
            {**target.model_dump(exclude_defaults=True), "url": target.url.reveal()}
            for target in fleet.targets()
        ],
        "pricing": {"gpu_hour": {"default": 2.0, "NVIDIA H100 80GB HBM3": 2.49, "NVIDIA L4": 0.8}},
        "slos": [
            {
                "name": "interactive-ttft",
                "metric": "ttft",
                # A bucket bound of vLLM's TTFT histogram and of SGLang's: the fleet's
                # histogram has the bounds its replicas' engines share.
                "threshold": "1s",
                "objective": 0.99,
                "window": "30d",
            },
            {
                "name": "interactive-itl",
                "metric": "itl",
                "threshold": "100ms",  # a bound of both engines' ITL histograms too
                "objective": 0.99,
                "window": "30d",
            },
        ],
    }
    if rules:
        config["rules"] = rules
    path = folder / "kneepoint.yaml"
    path.write_text(
        "# Written by `kneepoint demo`: the twin fleet it runs.\n"
        + yaml.safe_dump(config, sort_keys=False)
    )
    (folder / "fleet.yaml").write_text(yaml.safe_dump(FLEET, sort_keys=False))
    return path


def sweep_runs(fleet: Fleet) -> list[Run]:
    """A concurrency sweep of each replica's engine in virtual time, and one what-if (fp8 KV
    cache on the L4), so the Knee points page has runs to show and compare."""
    ladder = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    runs = [
        ladder_run(replica.engine.config, f"{name}-sweep", replica.served_name, ladder)
        for name, replica in fleet.replicas.items()
    ]
    l4 = fleet.replicas["qwen3-4b-l4"]
    what_if = replace(l4.engine.config, fp8_kv_cache=True)
    runs.append(ladder_run(what_if, "qwen3-4b-l4-fp8-kv-sweep", l4.served_name, ladder))
    return runs


def live_groups(fleet: Fleet) -> list[Group]:
    """The demo's live agent traffic: per model, its replicas and peak sessions."""
    return [
        Group(
            model,
            [
                fleet.url(r.name)
                for r in fleet.spec.replicas
                if fleet.replicas[r.name].served_name == model
            ],
            peak,
        )
        for model, peak in LIVE_PEAKS.items()
    ]


def run_demo(
    folder: Path | None,
    host: str,
    port: int,
    open_browser: bool,
    say: Callable[[str], None] = print,
    rules: list[Any] | None = None,
) -> int:
    """Run until Ctrl-C or SIGTERM; return the exit status. `rules` are added to the demo's
    config (`kneepoint demo --rules FILE`)."""
    # Before the twin's first thread: glibc gives each new thread that allocates an arena of
    # its own (up to 8 per core) and keeps their pages, and once more than 8 exist a later cap
    # changes nothing. The collector's scheduler caps them when it is made, here after the
    # twin's replicas, HTTP servers and traffic have run: the demo's process had 16 arenas on
    # 2 cores (malloc_info) and grew ~20 MiB an hour where `kneepoint collect` stayed flat.
    malloc.cap_arenas()
    folder = Path(folder) if folder else Path(tempfile.mkdtemp(prefix="kneepoint-demo-"))
    folder.mkdir(parents=True, exist_ok=True)
    fleet = Fleet(FleetSpec.model_validate(FLEET)).start()
    traffic: Traffic | None = None
    scheduler = StepSafeBackgroundScheduler()
    app: subprocess.Popen[bytes] | None = None
    private: Path | None = None
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C, or a service manager's stop
        signal.signal(signum, lambda *_: stop.set())
    try:
        config_file = write_config(folder, fleet, rules)
        config = load_config(config_file)
        check_listen(host, config)  # before the backfill: refused at once, with why
        say(f"config:   {config_file}\ndatabase: {str(config.database).removeprefix('sqlite:///')}")
        sessions = open_store(config.database)
        began = time.monotonic()

        def progress(step: str) -> None:
            if stop.is_set():  # Ctrl-C during the backfill stops at its next step
                raise KeyboardInterrupt
            say(f"backfill: {step}")

        rows = backfill_week(
            sessions,
            fleet,
            HISTORY_PEAKS,
            time.time() - 60,
            progress=progress,
            sleeps=HISTORY_SLEEPS,
            overloads=HISTORY_OVERLOADS,
        )
        say(f"backfill: a week, {rows} rows, in {time.monotonic() - began:.0f}s")
        runs = sweep_runs(fleet)
        with sessions.begin() as session:
            for run in runs:
                save_run(session, run, time.time())
        say(
            f"knee:     {len(runs)} twin sweeps in virtual time: {', '.join(r.label for r in runs)}"
        )
        traffic = Traffic(
            live_groups(fleet),
            day_seconds=LIVE_DAY_SECONDS,
            pause_scale=0.5,
            deploy_every=LIVE_DAY_SECONDS,
        ).start()
        sleeper = threading.Thread(
            target=sleep_schedule,
            args=(fleet, traffic, stop, time.monotonic()),
            name="twin-sleep",
            daemon=True,
        )
        sleeper.start()
        install(scheduler, standard_jobs(config, sessions, time.time), sessions)
        scheduler.start()
        app, private = app_process(config, config_file, host, port, open_browser)
        say(f"app:      http://{shown_host(host)}:{port}  (Ctrl-C stops everything)")
        say(f"try:      kneepoint status --config {config_file}")
        while not stop.wait(1.0):
            if app.poll() is not None:
                return app.returncode or 0
    except KeyboardInterrupt:
        pass
    finally:
        if app is not None:
            stop_app(app, private)
        if scheduler.running:
            scheduler.shutdown(wait=False)
        if traffic is not None:
            traffic.stop()
        fleet.stop()
    return 0


def sleep_schedule(
    fleet: Fleet,
    traffic: Traffic,
    stop: threading.Event,
    began: float,
    start: float = LIVE_SLEEP[0],
    length: float = LIVE_SLEEP[1],
    every: float = LIVE_DAY_SECONDS,
    drain: float = 5.0,
) -> None:
    """Put LIVE_SLEEPER to sleep for `length` seconds `start` seconds after `began` and every
    `every` seconds after: its URL is drained from the traffic `drain` seconds before."""
    replica, url = fleet.replicas[LIVE_SLEEPER], fleet.url(LIVE_SLEEPER)
    cycle = start
    while not stop.is_set():
        if stop.wait(max(0.0, began + cycle - drain - time.monotonic())):
            return
        traffic.draining.add(url)
        if stop.wait(drain):
            return
        replica.sleep(1)
        stopped = stop.wait(length)
        replica.wake_up()
        traffic.draining.discard(url)
        if stopped:
            return
        cycle += every


def shown_host(host: str) -> str:
    """The address to open: localhost for loopback or every interface, brackets for IPv6."""
    if host in ("127.0.0.1", "0.0.0.0", "::", "::1", "localhost"):
        return "localhost"
    return f"[{host}]" if ":" in host else host


if __name__ == "__main__":
    sys.exit(run_demo(None, "127.0.0.1", 8501, False))
