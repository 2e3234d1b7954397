"""Page bench: every page as its router runs it, at fleet sizes, on PostgreSQL, against the
aims of issue 25; plus alert evaluation with SLOs and the weekly review.

    .venv/bin/python bench/bench_pages.py [--replicas 4,200,1000] [--days 7] [--raw-hours 12]
        [--pages overview,alerts,...|none] [--ranges 1h,24h,7d] [--eval-rounds 8] [--no-review]
        [--no-warmer-round] [--steady] [--keep DIR] [--source DIR]... [--seed-only]

For each fleet size a store is seeded by bench/scale_seed.py (SQL only, PostgreSQL: samples
every 15 s for the newest --raw-hours, one a minute before that, the 5-minute and hourly
summary tiers; --replicas vLLM replicas and a dcgm node per 8 of them, 8 GPUs each) on a
throwaway PostgreSQL cluster (tests/postgres.py), or on one kept in DIR with --keep, where a
store seeded once is reused by later runs (per size, days, raw hours and schema version; a
checkout with a newer schema gets a copy of the newest older store, migrated forward).

What is timed runs in a child process (bench/page_runs.py) with the product code of each
--source checkout first on its PYTHONPATH (default: this one; give several, e.g. this one
and `git worktree add /tmp/old 4f6a22f`, to get before and after from one run and one bench):

- evaluation: `evaluate_once` with a latency and an availability SLO, --eval-rounds rounds
  15 s apart (store time); those entering a new minute recompute burn rates; with --steady
  the SLO running sums are first built to the rounds' start in one untimed go (timed apart),
  so the rounds are steady ones, not rounds that also fold the week's backfill;
- each page: the whole script run of app/main.py with ?page=<url_path>&range=<range> through
  streamlit.testing.v1.AppTest, cold (after st.cache_data.clear()), warm (a second
  session in the same collection round, no new data), and after a new round (`round`: a
  round written, the app's cache warmer, app/warm.py, run to the end for it and timed,
  `warmer`, then the page in a fresh session; a checkout without a warmer runs the page
  right after the round); a page that raises shows its error;
- the warmer's cost per round (wall and CPU seconds) with every page visited at 1 h: the
  mean of a minute of rounds (the SLO reports are made once a minute), and each round's;
- the weekly review: `review.report.build_report` over 7 days.

Prints one table (seconds) with the aims (pages ≤ 1.0 s at 1 h and 24 h and ≤ 2.0 s at 7 d,
evaluation ≤ 1.0 s median and ≤ 2.0 s at most, review ≤ 30 s) and whether each is met.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from pg_cluster import kept_postgres, throwaway_postgres  # noqa: E402
from scale_seed import node_name, replica_name  # noqa: E402

WORKER = ROOT / "bench" / "page_runs.py"
GPUS = 8  # per dcgm node, as bench/bench_scale.py seeds them
PAGE_AIM = {"1h": 1.0, "24h": 1.0, "7d": 2.0}
EVAL_MEDIAN_AIM, EVAL_MAX_AIM, REVIEW_AIM = 1.0, 2.0, 30.0


def say(line: str = "") -> None:
    print(line, flush=True)


def checkout_label(source: Path) -> str:
    """The checkout's commit, '+changes' when its work tree differs from it."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(source), *args], capture_output=True, text=True, check=False
        )
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or source.name
    changed = git("status", "--porcelain", "--untracked-files=no")
    return commit + ("+changes" if changed else "")


def schema_version(source: Path) -> str:
    """The newest migration a checkout has: a store seeded by one schema is not another's."""
    versions = sorted((source / "kneepoint" / "migrations" / "versions").glob("[0-9]*.py"))
    return versions[-1].name.split("_")[0] if versions else "0"


def write_config(folder: Path, url: str, replicas: int) -> Path:
    """The fleet the seeder writes, with a latency SLO and an availability SLO."""
    nodes = math.ceil(replicas / GPUS)
    targets: list[dict[str, Any]] = [
        {
            "name": replica_name(i),
            "kind": "vllm",
            "url": f"http://127.0.0.1/r/{i}/metrics",
            "gpus": [f"{node_name(i // GPUS)}/{i % GPUS}"],
        }
        for i in range(replicas)
    ] + [
        {"name": node_name(j), "kind": "dcgm", "url": f"http://127.0.0.1/d/{j}/metrics"}
        for j in range(nodes)
    ]
    config = {
        "database": url,
        "scrape_interval": "15s",  # the seeder's raw rows are 15 s apart
        "evaluation_interval": "15s",
        "targets": targets,
        "pricing": {"gpu_hour": {"default": 2.0}},
        "slos": [
            {
                "name": "interactive-ttft",
                "metric": "ttft",
                "threshold": "0.5s",
                "objective": 0.99,
                "window": "30d",
            },
            {"name": "available", "kind": "availability", "objective": 0.99, "window": "30d"},
        ],
    }
    path = folder / f"kneepoint-{replicas}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def worker(source: Path, *args: str) -> str:
    """Run bench/page_runs.py with `source`'s product code; its progress goes to our stderr."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    done = subprocess.run(
        [sys.executable, str(WORKER), *args],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=source,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"page_runs.py {args[0]} failed with {done.returncode}")
    return done.stdout


def page_titles(source: Path) -> dict[str, str]:
    """url_path → title, read from the checkout's app/registry.py without importing it."""
    code = (source / "app" / "registry.py").read_text()
    found = re.findall(r'PageSpec\(\s*"[^"]+",\s*"([^"]+)",\s*"[^"]+",\s*"([^"]+)"', code)
    titles = {path: title for title, path in found}
    return titles


def verdict(seconds: float, aim: float) -> str:
    return "yes" if seconds <= aim else f"no ({seconds / aim:.1f}×)"


def table(
    sources: list[str], results: list[dict[str, Any]], ranges: list[str], titles: dict[str, str]
) -> list[str]:
    """The printed table for one fleet size: a column pair (cold, warm) per source."""
    lines = []
    head = f"{'page':<22} {'range':>5} |"
    for label in sources:
        head += f" {label[:21]:^49} |"
    lines.append(head)
    heads = f" {'cold s':>7} {'warm s':>7} {'round s':>7} {'warmer':>7} {'aim':>4} {'met':>11} |"
    lines.append(f"{'':<22} {'':>5} |" + heads * len(sources))
    errors: list[str] = []
    pages = [row["page"] for row in results[0]["pages"] if row["range"] == ranges[0]]
    for label in ranges:
        for page in pages:
            line = f"{page:<22} {label:>5} |"
            for source, result in zip(sources, results, strict=True):
                row = next(r for r in result["pages"] if r["page"] == page and r["range"] == label)
                aim = PAGE_AIM.get(label, 1.0)
                cells: list[str] = []
                for kind in ("cold", "warm", "round"):
                    run = row[kind]
                    if not run["error"] and run["title"] != titles.get(page):
                        # The router showed another page than asked: say so, time it anyway.
                        errors.append(f"{source} {page} {label} {kind}: showed {run['title']!r}")
                    if run["error"]:
                        cells.append(f"{'ERROR':>7}")
                        errors.append(f"{source} {page} {label} {kind}: {run['error']}")
                    else:
                        cells.append(f"{run['seconds']:7.2f}")
                warmer = row["round"]["warmer"]["seconds"]
                cells.append(f"{'-':>7}" if warmer is None else f"{warmer:7.2f}")
                worst = max(row[kind]["seconds"] for kind in ("cold", "warm", "round"))
                failed = any(row[kind]["error"] for kind in ("cold", "warm", "round"))
                met = "error" if failed else verdict(worst, aim)
                line += f" {' '.join(cells)} {aim:4.1f} {met:>11} |"
            lines.append(line)
    # The warmer per round: the mean of a minute of rounds, then each of them.
    line = f"{'warmer, a round, 1 h pages':<28} |"
    each = f"{'warmer, a minute of rounds':<28} |"
    for result in results:
        done = result.get("warmer")
        if done is None:  # --no-warmer-round, or no pages
            line += f" {'(not run)':>49} |"
            each += f" {'':>49} |"
        elif done.get("seconds") is None:
            line += f" {'(no warmer)':>49} |"
            each += f" {'':>49} |"
        else:
            cost = f"{done['seconds']:.2f} s ({done['cpu']:.2f} s CPU), {done['calls']} calls"
            line += f" {cost:>49} |"
            seconds = " / ".join(f"{r['seconds']:.2f}" for r in done.get("rounds") or [done])
            each += f" {seconds + ' s':>49} |"
    lines += [line, each]
    line = f"{'alerts pending or firing':<28} |"
    for result in results:
        counts = result.get("alerts") or {}
        cell = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "none"
        line += f" {cell:>49} |"
    lines.append(line)
    if any(result.get("backfill") for result in results):
        line = f"{'SLO sums built first':<28} |"
        for result in results:
            done = result.get("backfill")
            cell = "-" if not done else f"{done['seconds']:.1f} s, {done['buckets']} buckets"
            line += f" {cell:>49} |"
        lines.append(line)
    # Evaluation: burn-rate rounds and plain rounds, median and max of each.
    for kind, burn in (("evaluation, burn-rate rounds", True), ("evaluation, plain rounds", False)):
        line = f"{kind:<28} |"
        for source, result in zip(sources, results, strict=True):
            rounds = [r for r in result["evaluation"] if r["burn"] == burn]
            errors += [f"{source} {kind}: {r['error']}" for r in rounds if r["error"]]
            times = [r["seconds"] for r in rounds]
            if not times:
                line += f" {'(none)':>49} |"
                continue
            median, most = statistics.median(times), max(times)
            met = (
                "yes"
                if median <= EVAL_MEDIAN_AIM and most <= EVAL_MAX_AIM
                else f"no ({max(median / EVAL_MEDIAN_AIM, most / EVAL_MAX_AIM):.1f}×)"
            )
            cell = f"med {median:5.2f} max {most:5.2f} n={len(times):<2} {met:>9}"
            line += f" {cell:>49} |"
        lines.append(line)
    line = f"{'weekly review (7 d)':<28} |"
    for source, result in zip(sources, results, strict=True):
        review = result["review"]
        if review is None:
            line += f" {'(not run)':>49} |"
        elif review["error"]:
            line += f" {'ERROR':>49} |"
            errors.append(f"{source} weekly review: {review['error']}")
        else:
            met = verdict(review["seconds"], REVIEW_AIM)
            cell = f"{review['seconds']:7.2f} s  aim {REVIEW_AIM:4.0f}  {met:>11}"
            line += f" {cell:>49} |"
    lines.append(line)
    lines += [f"error: {e}" for e in errors]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", default="4,200,1000", help="fleet sizes, comma-separated")
    parser.add_argument("--days", type=float, default=7.0, help="days of seeded history")
    parser.add_argument("--raw-hours", type=float, default=12.0, help="newest hours at 15 s")
    parser.add_argument(
        "--pages", help="url paths, comma-separated (default: every page; none: no page)"
    )
    parser.add_argument("--ranges", default="1h,24h,7d")
    parser.add_argument("--eval-rounds", type=int, default=8, help="timed rounds, 15 s apart")
    parser.add_argument("--no-review", action="store_true", help="skip the weekly review")
    parser.add_argument(
        "--no-warmer-round",
        action="store_true",
        help="skip the warmer's minute of rounds with every page visited (at 1,000 replicas "
        "each round replays every page's reads: minutes)",
    )
    parser.add_argument(
        "--steady",
        action="store_true",
        help="build the SLO running sums before the evaluation rounds (the backfill timed "
        "apart), so the rounds are steady ones",
    )
    parser.add_argument("--keep", type=Path, help="keep the PostgreSQL cluster in DIR, reuse it")
    parser.add_argument(
        "--source",
        type=Path,
        action="append",
        help="a checkout whose product code is timed (repeat to compare; default: this one)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="a page run's hang guard")
    parser.add_argument(
        "--seed-only", action="store_true", help="seed (or find) each size's store, time nothing"
    )
    args = parser.parse_args()
    if args.raw_hours > 48:
        parser.error("--raw-hours: the raw retention keeps 48 h")
    sources = [s.resolve() for s in (args.source or [ROOT])]
    labels = [checkout_label(s) for s in sources]
    titles = page_titles(sources[0])
    # `--pages none`: evaluation and the review only (no page runs, no warmer rounds).
    pages = [] if args.pages == "none" else args.pages.split(",") if args.pages else list(titles)
    unknown = [p for p in pages if p not in titles]
    if unknown:
        parser.error(f"--pages: no page {', '.join(unknown)} (pages: {', '.join(titles)})")
    ranges = args.ranges.split(",")
    if any(r not in PAGE_AIM for r in ranges):
        parser.error(f"--ranges: one of {', '.join(PAGE_AIM)}")
    sizes = [int(n) for n in args.replicas.split(",")]
    began = time.perf_counter()
    say(
        f"page bench: {', '.join(map(str, sizes))} replicas × {args.days:g} days on PostgreSQL; "
        f"sources: {', '.join(f'{lab} ({src})' for lab, src in zip(labels, sources, strict=True))}"
    )
    cluster: Callable[[], Any] = (
        (lambda: kept_postgres(args.keep)) if args.keep else throwaway_postgres
    )
    with cluster() as database, tempfile.TemporaryDirectory() as folder:
        for replicas in sizes:
            results: list[dict[str, Any]] = []
            for source in sources:
                stem = f"pages_{replicas}r_{args.days:g}d_{args.raw_hours:g}h_".replace(".", "_")
                version = schema_version(source)
                # A store seeded under an older schema is copied and migrated forward (by the
                # seed step's open_store) rather than seeded again: the newest such first.
                older = [f"{stem}{v:04d}" for v in range(int(version) - 1, 0, -1)]
                url, _ = database(f"{stem}{version}", older)
                seeded = json.loads(
                    worker(
                        source,
                        "seed",
                        *("--url", url, "--replicas", str(replicas)),
                        *("--nodes", str(math.ceil(replicas / GPUS)), "--gpus", str(GPUS)),
                        *("--days", str(args.days), "--raw-hours", str(args.raw_hours)),
                    )
                )
                if args.seed_only:
                    say(f"{replicas} replicas: store {'reused' if seeded['reused'] else 'seeded'}")
                    continue
                config = write_config(Path(folder), url, replicas)
                out = Path(folder) / f"result-{replicas}-{len(results)}.json"
                say(
                    f"{replicas} replicas, {labels[len(results)]}: store "
                    f"{'reused' if seeded['reused'] else 'seeded'}; measuring"
                )
                worker(
                    source,
                    "measure",
                    *("--config", str(config), "--app", str(source / "app" / "main.py")),
                    *("--now", repr(seeded["now"]), "--pages", ",".join(pages)),
                    *("--ranges", ",".join(ranges), "--eval-rounds", str(args.eval_rounds)),
                    *(() if args.no_review else ("--review",)),
                    *(("--steady",) if args.steady else ()),
                    *(("--warmer-round",) if pages and not args.no_warmer_round else ()),
                    *("--timeout", str(args.timeout), "--out", str(out)),
                )
                results.append(json.loads(out.read_text()))
            if not results:  # --seed-only
                continue
            say()
            say(
                f"== {replicas} replicas × {args.days:g} days (PostgreSQL; seconds; aim: pages "
                "≤ 1.0 s at 1 h and 24 h, ≤ 2.0 s at 7 d, cold and warm; evaluation ≤ 1.0 s "
                "median, ≤ 2.0 s max; review ≤ 30 s)"
            )
            for line in table(labels, results, ranges, titles):
                say(line)
            say()
    say(f"done in {(time.perf_counter() - began) / 60:.1f} min")


if __name__ == "__main__":
    main()
