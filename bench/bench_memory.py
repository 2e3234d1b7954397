"""The collector's resident memory over time, by launch path, against the twin fleet.

    .venv/bin/python bench/bench_memory.py [--minutes 60] [--targets 100] [--interval 5]
        [--every 60] [--last 40] [--source LABEL=DIR ...] [--image] [--demo] [--no-collect]
        [--container IMAGE]

Each collector is `kneepoint collect` of a source tree (`--source LABEL=DIR`, repeatable;
default: this checkout, labelled "collect") run without MALLOC_ARENA_MAX, as `kneepoint
collect` runs from a pip install or a checkout; `--image` adds one with MALLOC_ARENA_MAX=2,
as the Dockerfile sets it for the image compose and the Helm chart run; `--demo` adds
`kneepoint demo --no-browser` of each source tree (what ./scripts/run starts after its
setup: its own four-replica twin, backfill, collector and app; its main process is measured,
which holds the twin and the collector, and apart from it the whole process tree, the app's
child included: "demo tree"); `--no-collect` leaves out the sources' `kneepoint collect`
(and `--image`'s), for a run of demos and containers only. `--container IMAGE` adds the
image built from the Dockerfile (`docker build -t IMAGE .`) run by a Docker daemon
(DOCKER_HOST) twice: as docker-compose.yaml's kneepoint-collector service runs it (its
command, environment and config mount, after its kneepoint-migrate service's `kneepoint
migrate`) and as the Helm chart's collector pod runs it (the same, plus the pod's uid 999,
read-only root with /tmp writable, no capabilities, no privilege escalation and the chart's
1 GiB memory limit); neither the compose tool nor Kubernetes runs them, so the compose
healthcheck and the chart's probes (separate processes) do not run. Both use the host's
network (the twin listens on loopback) and measure the container's first process, `kneepoint
collect`, from the host's /proc. All the collectors scrape one shared twin (`--targets`, as
bench/bench_prometheus.py builds it, in a child process), each into its own SQLite database,
at the same time.

Every `--every` seconds it prints each collector's VmRSS; at the end, per collector: RSS at
the first sample, the last and the largest, the peak (VmHWM), and the slopes of
least-squares lines (MiB per hour) through the samples from the fifth minute on and through
those of the last `--last` minutes (the first minutes hold the start-up's growth: tables,
caches, the first rollup; on a fresh store the later ones too, while its windows fill),
and each 10 minutes' floor (the smallest sample): RSS swings by tens of MiB within minutes
(a rollup's or evaluation's peak, then the trim after it), so a 40-minute slope through
such swings is mostly noise, while the floors show what stays resident.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from bench_prometheus import serve_twin  # noqa: E402
from collector_process import (  # noqa: E402
    ROOT,
    environment,
    kneepoint,
    rss_mib,
    start_collector,
    stop_collector,
    tree,
    wait_for_rows,
    write_config,
)

from tests.conftest import free_port  # noqa: E402


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB), in MiB per hour (0 with under two points)."""
    if len(points) < 2:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in points) / var * 3600


def floors(points: list[tuple[float, float]], block: float = 600.0) -> list[float]:
    """The smallest MiB of each `block` seconds of (seconds, MiB) samples, in time order."""
    lowest: dict[int, float] = {}
    for at, mib in points:
        index = int(at // block)
        lowest[index] = min(mib, lowest.get(index, mib))
    return [lowest[index] for index in sorted(lowest)]


def tree_rss_mib(pid: int) -> float:
    """VmRSS of `pid` and every process below it, summed, MiB."""
    total = 0.0
    for member in tree(pid):
        try:
            total += rss_mib(member)[0]
        except (OSError, KeyError):
            continue  # ended between the listing and the read, or a zombie
    return total


# The chart's collector pod as `helm template` renders it (deploy/helm/kneepoint values.yaml:
# securityContext, podSecurityContext, collector.resources.limits, the env of every
# container; /tmp an emptyDir) as `docker run` options.
HELM_POD = ["--user", "999:999", "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", "--memory", "1g",
            "-e", "HOME=/var/lib/kneepoint", "-e", "PYTHONDONTWRITEBYTECODE=1"]  # fmt: skip


def container_run(image: str, name: str, config: Path, command: list[str],
                  pod: list[str]) -> list[str]:  # fmt: skip
    """`docker run` of `command` in `image` as compose's kneepoint services run it: the
    config mounted read-only at /etc/kneepoint/kneepoint.yaml and named by KNEEPOINT_CONFIG,
    the data folder (the config's folder, where its SQLite database is) at the same path;
    `pod` adds the chart's pod settings."""
    folder = config.parent
    return [
        "docker", "run", "--rm", "--name", name, "--network", "host", *pod,
        "-e", "KNEEPOINT_CONFIG=/etc/kneepoint/kneepoint.yaml",
        "-v", f"{config}:/etc/kneepoint/kneepoint.yaml:ro", "-v", f"{folder}:{folder}",
        image, *command,
    ]  # fmt: skip


def container_pid(name: str, process: subprocess.Popen[bytes], wait: float = 120.0) -> int:
    """The host pid of container `name`'s first process, once it runs."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and process.poll() is None:
        done = subprocess.run(["docker", "inspect", "-f", "{{.State.Pid}}", name],
                              capture_output=True, text=True, check=False)  # fmt: skip
        if done.returncode == 0 and done.stdout.strip() not in ("", "0"):
            return int(done.stdout)
        time.sleep(0.5)
    sys.exit(f"container {name} did not start (exit {process.poll()})")


def start_containers(
    image: str, folder: Path, targets: list[tuple[str, str, str, list[str]]], interval: float
) -> list[tuple[str, subprocess.Popen[bytes], Path, int, str]]:
    """The compose and Helm collectors of `image`: (label, docker client, place, pid, name)."""
    started: list[tuple[str, subprocess.Popen[bytes], Path, int, str]] = []
    for label, pod in (("compose (container)", []), ("Helm (container)", HELM_POD)):
        place = folder / f"container{len(started)}"
        place.mkdir()
        place.chmod(0o777)  # the image's user (uid 999) writes the database here
        config = write_config(place, targets, interval)
        name = f"kneepoint-bench-memory-{os.getpid()}-{len(started)}"
        subprocess.run(container_run(image, f"{name}-migrate", config, ["kneepoint", "migrate"],
                                     pod), check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        process = subprocess.Popen(
            container_run(image, name, config, ["kneepoint", "collect"], pod),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        started.append((label, process, place, container_pid(name, process), name))
        wait_for_rows(place / "k.db", 1)
    return started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--targets", type=int, default=100)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--every", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--last", type=float, default=40.0, help="minutes of the last slope")
    parser.add_argument("--sessions", type=float, default=10.0)
    parser.add_argument("--source", action="append", default=[], help="LABEL=DIR")
    parser.add_argument("--image", action="store_true", help="also with MALLOC_ARENA_MAX=2")
    parser.add_argument("--demo", action="store_true", help="also `kneepoint demo`")
    parser.add_argument("--no-collect", action="store_true", help="no `kneepoint collect`")
    parser.add_argument("--container", metavar="IMAGE", help="also compose's and Helm's")
    args = parser.parse_args()
    sources = [
        (label, Path(folder).resolve())
        for label, folder in (s.split("=", 1) for s in args.source or [f"collect={ROOT}"])
    ]
    ours_end, twin_end = multiprocessing.get_context("fork").Pipe()
    twin = multiprocessing.get_context("fork").Process(
        target=serve_twin, args=(args.targets, args.sessions, twin_end), daemon=True
    )
    twin.start()
    targets = ours_end.recv()
    folder = Path(tempfile.mkdtemp(prefix="kneepoint-bench-memory-"))
    runs: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    containers: list[tuple[str, subprocess.Popen[bytes], Path, int, str]] = []
    demos: dict[int, str] = {}  # a demo's pid: its label
    plans: list[tuple[str, Path, str | None]] = [(label, src, None) for label, src in sources]
    if args.no_collect:
        plans = []
    elif args.image:
        plans.append(("image (MALLOC_ARENA_MAX=2)", sources[0][1], "2"))
    try:
        for index, (label, source, arena_max) in enumerate(plans):
            place = folder / f"c{index}"
            place.mkdir()
            config = write_config(place, targets, args.interval)
            kneepoint(source, "migrate", "--config", str(config))
            runs.append((label, start_collector(source, config, place / "jobs.json", arena_max),
                         place))  # fmt: skip
            wait_for_rows(place / "k.db", 1)
        for label, source in sources if args.demo else []:
            place = folder / f"demo-{len(demos)}"
            demo = subprocess.Popen(
                [sys.executable, "-m", "kneepoint.cli", "demo", "--no-browser", "--dir",
                 str(place), "--port", str(free_port())],
                cwd=source, env=environment(source),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            named = "demo" if len(sources) == 1 else f"demo {label}"
            runs.append((f"{named} (./scripts/run)", demo, place))
            demos[demo.pid] = f"{named} tree"
        if args.container:
            containers = start_containers(args.container, folder, targets, args.interval)
        measured = [(label, process, process.pid) for label, process, _ in runs] + [
            (label, process, pid) for label, process, _, pid, _ in containers
        ]
        print(
            f"{args.targets} targets every {args.interval:g}s, {len(measured)} collectors at once, "
            f"VmRSS every {args.every:g}s for {args.minutes:g} min",
            flush=True,
        )
        began = time.monotonic()
        samples: dict[str, list[tuple[float, float]]] = {label: [] for label, _, _ in measured}
        peaks: dict[str, float] = {}
        while True:
            now = time.monotonic() - began
            shown = []
            for label, process, pid in measured:
                if process.poll() is not None:
                    shown.append(f"{label}: exited {process.returncode}")
                    continue
                rss, hwm = rss_mib(pid)
                samples[label].append((now, rss))
                peaks[label] = hwm
                shown.append(f"{label} {rss:.0f}")
                if pid in demos:
                    whole = tree_rss_mib(pid)
                    samples.setdefault(demos[pid], []).append((now, whole))
                    shown.append(f"{demos[pid]} {whole:.0f}")
            print(f"  min {now / 60:5.1f}: " + ", ".join(shown) + " MiB", flush=True)
            if now >= args.minutes * 60:
                break
            time.sleep(max(0.0, min(args.every, args.minutes * 60 - now)))
    finally:
        for _label, process, place in runs:
            stop_collector(process, place / "jobs.json")
        for _label, process, _place, _pid, name in containers:
            subprocess.run(["docker", "stop", "-t", "30", name], capture_output=True, check=False)
            process.wait(timeout=60)
        ours_end.send("stop")
        twin.join(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)
    for label, points in samples.items():
        if not points:
            continue
        settled = [p for p in points if p[0] >= 300] or points
        last = [p for p in points if p[0] >= points[-1][0] - args.last * 60]
        sizes = [p[1] for p in points]
        peak = f"peak (VmHWM) {peaks[label]:.0f} MiB; " if label in peaks else ""
        print(
            f"{label}: RSS first {sizes[0]:.0f} MiB, last {sizes[-1]:.0f}, max {max(sizes):.0f}, "
            f"{peak}slope from minute 5: {slope_per_hour(settled):+.1f} MiB/h, over the last "
            f"{args.last:g} min: {slope_per_hour(last):+.1f} MiB/h ({len(points)} samples); "
            f"floor per 10 min: {' '.join(f'{mib:.0f}' for mib in floors(points))} MiB"
        )


if __name__ == "__main__":
    main()
