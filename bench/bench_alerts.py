"""Alert latency: from the scrape that crosses a threshold (a rule with `for: 0s`) to the
webhook request arriving at a receiver, over real loopback HTTP, through the collector, the
store, the rule engine and the outbox. Evaluation here runs right after the scrape; in
`kneepoint serve` it runs every `evaluation_interval` (15 s by default), which adds up to
that interval on top.

    .venv/bin/python bench/bench_alerts.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from alerts.evaluate import evaluate_once  # noqa: E402
from alerts.outbox import deliver_due, http_sender  # noqa: E402
from collectors.collect import collect_once  # noqa: E402
from kneepoint.config import load_config  # noqa: E402
from kneepoint.store.db import open_store  # noqa: E402

CAPTURE = ROOT.parent / "shared" / "fixtures" / "vllm-0.32.0-cpu-prefix-caching.prom"


def serve(state: dict[str, object]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = str(state["metrics"]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            state.setdefault("arrivals", []).append(time.perf_counter())  # type: ignore[union-attr]
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    calm = CAPTURE.read_text()
    full = calm.replace(
        'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.0',
        'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.97',
    )
    assert full != calm
    state: dict[str, object] = {"metrics": calm}
    server = serve(state)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    latencies = []
    with tempfile.TemporaryDirectory() as folder:
        config_file = Path(folder) / "kneepoint.yaml"
        config_file.write_text(
            f"""
database: sqlite:///{Path(folder) / "k.db"}
targets: [{{name: replica-a, kind: vllm, url: "{base}/metrics"}}]
channels: [{{name: hook, type: webhook, url: "{base}/hook"}}]
rules:
  - {{name: kv-cache-saturated, metric: kv_cache_occupancy, op: ">", threshold: 0.9,
     for: 0s, severity: page, channels: [hook]}}
"""
        )
        config = load_config(config_file)
        sessions = open_store(config.database)
        for _ in range(args.rounds):
            state["metrics"], state["arrivals"] = calm, []
            collect_once(config, sessions)
            with sessions.begin() as session:
                evaluate_once(session, config, time.time())  # resolves the last round's
            with sessions() as session:
                deliver_due(session, config, time.time(), http_sender())
            state["metrics"], state["arrivals"] = full, []
            began = time.perf_counter()  # the crossing scrape starts
            collect_once(config, sessions)
            with sessions.begin() as session:
                evaluate_once(session, config, time.time())
            with sessions() as session:
                deliver_due(session, config, time.time(), http_sender())
            arrivals = state["arrivals"]
            assert isinstance(arrivals, list) and arrivals, "no webhook arrived"
            latencies.append(arrivals[0] - began)
    server.shutdown()
    ms = sorted(x * 1000 for x in latencies)
    print(
        f"alert latency over {args.rounds} rounds (scrape → store → rules → outbox → webhook): "
        f"median {statistics.median(ms):.0f} ms, p90 {ms[int(0.9 * (len(ms) - 1))]:.0f} ms, "
        f"max {ms[-1]:.0f} ms"
    )


if __name__ == "__main__":
    main()
