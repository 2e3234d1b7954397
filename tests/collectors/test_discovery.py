"""Discovery through Prometheus, its own logic: the config's errors, the name template, which
of /api/v1/targets' active targets become targets, explicit targets winning, and the GPU
join by pod. (Against a real Prometheus: tests/real/test_discovery.py.)"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from collectors.discovery import MissingLabel, current, discovered_targets, render
from kneepoint.config import Config, ConfigError, Target, parse_config
from kneepoint.status import replica_of

SOURCE = "prometheus: {url: 'http://prometheus:9090'}\n"


def active(job: str, instance: str, **labels: str) -> dict[str, Any]:
    """One entry of /api/v1/targets' activeTargets, as Prometheus writes it."""
    return {
        "discoveredLabels": {"__address__": instance, "__meta_x": "y", "zone": "eu"},
        "labels": {"job": job, "instance": instance, **labels},
        "scrapePool": job,
        "scrapeUrl": f"http://{instance}/metrics",
        "health": "up",
    }


def config(discovery: str, targets: str = "") -> Config:
    return parse_config(SOURCE + discovery + targets)


def test_a_template_is_filled_from_labels_and_a_missing_label_is_named() -> None:
    labels = {"namespace": "inference", "pod": "qwen-0"}
    assert render("{namespace}.{pod}", labels) == "inference.qwen-0"
    assert render("vllm-{pod}", labels) == "vllm-qwen-0"
    with pytest.raises(MissingLabel, match="node"):
        render("{node}", labels)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "discovery: {prometheus: {replicas: {jobs: [v], name: '{namespace}/{pod}'}}}",
            "discovery.prometheus.replicas.name: holds '/', which a target name cannot",
        ),
        (
            "discovery: {prometheus: {replicas: {jobs: [v], name: 'fixed'}}}",
            "discovery.prometheus.replicas.name: must name at least one label",
        ),
        (
            "discovery: {prometheus: {replicas: {jobs: [v], name: '{pod!r}'}}}",
            "discovery.prometheus.replicas.name: field {pod} must be a plain label name",
        ),
        (
            "discovery: {prometheus: {replicas: {name: '{pod}'}}}",
            "discovery.prometheus.replicas: needs jobs or match",
        ),
        (
            "discovery: {prometheus: {replicas: {jobs: [v], name: '{pod}', selector: x}}}",
            "discovery.prometheus.replicas.selector: is not a known key",
        ),
        (
            "discovery: {prometheus: {}, kubernetes: {}}",
            "discovery.kubernetes: needs replicas or gpu_nodes",
        ),
        ("discovery: {}", "discovery: needs prometheus or kubernetes"),
    ],
)
def test_config_errors_are_one_sentence_naming_the_key(text: str, error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(SOURCE + text)
    assert error in str(caught.value)
    assert "\n" not in str(caught.value)


def test_discovery_needs_a_prometheus_source() -> None:
    with pytest.raises(ConfigError, match=r"discovery\.prometheus needs prometheus:"):
        parse_config("discovery: {prometheus: {replicas: {jobs: [v], name: '{pod}'}}}")


DISCOVERY = """discovery:
  prometheus:
    replicas: {jobs: [vllm], match: {namespace: inference}, name: "{namespace}.{pod}"}
    gpu_nodes: {jobs: [dcgm], name: "dcgm-{instance}"}
"""
FOUND = [
    active("vllm", "10.0.0.1:8000", namespace="inference", pod="qwen-0"),
    active("vllm", "10.0.0.2:8000", namespace="inference", pod="llama-0"),
    active("vllm", "10.0.0.3:8000", namespace="batch", pod="other-0"),  # match: left out
    active("vllm", "10.0.0.4:8000", namespace="inference"),  # no pod: left out
    active("node", "10.0.0.9:9100"),  # another job
    active("dcgm", "10.0.0.1:9400"),
]


def test_active_targets_become_replicas_and_gpu_nodes_named_by_their_labels() -> None:
    targets = discovered_targets(config(DISCOVERY), FOUND)
    # Replicas, then GPU nodes, each in name order (not the order Prometheus lists them).
    assert [(t.name, t.kind, t.instance) for t in targets] == [
        ("inference.llama-0", "vllm", "10.0.0.2:8000"),
        ("inference.qwen-0", "vllm", "10.0.0.1:8000"),
        ("dcgm-10.0.0.1:9400", "dcgm", "10.0.0.1:9400"),
    ]
    qwen = targets[1]
    assert (qwen.pod, qwen.namespace) == ("qwen-0", "inference")
    assert qwen.url.reveal() == "http://10.0.0.1:8000/metrics"
    # Labels Prometheus discovered but did not keep serve the template too (`__` meta not).
    rule = "discovery: {prometheus: {replicas: {jobs: [vllm], name: '{zone}-{pod}'}}}"
    assert discovered_targets(config(rule), FOUND[:1])[0].name == "eu-qwen-0"


def test_explicit_targets_win_on_a_name_or_instance_conflict() -> None:
    explicit = """targets:
  - {name: inference.qwen-0, kind: vllm, url: 'http://10.0.0.7:8000/metrics'}
  - {name: llama, kind: vllm, url: 'http://10.0.0.2:8000/metrics', gpus: [n/0]}
"""
    targets = discovered_targets(config(DISCOVERY, explicit), FOUND)
    names = [t.name for t in targets]
    assert names == ["inference.qwen-0", "llama", "dcgm-10.0.0.1:9400"]
    assert targets[0].url.reveal() == "http://10.0.0.7:8000/metrics", "the explicit one kept"


def test_a_gpu_joins_the_replica_its_pod_label_names_and_is_unassigned_without_one() -> None:
    targets = discovered_targets(config(DISCOVERY), FOUND)
    fleet = config(DISCOVERY).model_copy(update={"targets": targets})
    hosts = {"gpu-node-1"}
    assert replica_of(fleet, hosts, 0, "qwen-0", "inference") == "inference.qwen-0"
    assert replica_of(fleet, hosts, 1, "llama-0", None) == "inference.llama-0"
    assert replica_of(fleet, hosts, 2, "qwen-0", "batch") is None, "another namespace's pod"
    assert replica_of(fleet, hosts, 3, "gone-0", "inference") is None, "its pod is gone"
    assert replica_of(fleet, hosts, 3, None, None) is None
    # A `gpus:` list still decides first.
    listed = Target.model_validate(
        {"name": "listed", "kind": "vllm", "url": "http://h:1/metrics", "gpus": ["gpu-node-1/0"]}
    )
    both = fleet.model_copy(update={"targets": [*targets, listed]})
    assert replica_of(both, hosts, 0, "qwen-0", "inference") == "listed"


class FakeTargetsApi(BaseHTTPRequestHandler):
    """A loopback /api/v1/targets answering with the class's `active` list."""

    active: ClassVar[list[dict[str, Any]]] = []

    def do_GET(self) -> None:
        body = json.dumps(
            {"status": "success", "data": {"activeTargets": self.active, "droppedTargets": []}}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def test_targets_found_before_are_kept_while_prometheus_cannot_be_read() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeTargetsApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    source = f"prometheus: {{url: '{url}', timeout: 2s}}\n"
    discovery = parse_config(source + DISCOVERY)
    try:
        FakeTargetsApi.active = FOUND[:1]
        assert [t.name for t in current(discovery, 0.0).targets] == ["inference.qwen-0"]
        FakeTargetsApi.active = FOUND[:2]
        assert len(current(discovery).targets) == 1, "within the scrape interval: not asked again"
        assert len(current(discovery, 0.0).targets) == 2, "asked again: the new target"
    finally:
        server.shutdown()
        server.server_close()
    kept = current(discovery, 0.0).targets
    assert [t.name for t in kept] == ["inference.llama-0", "inference.qwen-0"]


def test_both_sources_merge_explicit_first_then_prometheus_then_kubernetes() -> None:
    from collectors.discovery import merge

    def target(name: str, kind: str, url: str) -> Target:
        return Target.model_validate({"name": name, "kind": kind, "url": url})

    explicit = [target("qwen", "vllm", "http://10.0.0.1:8000/metrics")]
    prometheus = [
        target("inference.llama-0", "vllm", "http://10.0.0.2:8000/metrics"),
        target("inference.qwen-0", "vllm", "http://10.0.0.1:8000/metrics"),  # qwen's instance
    ]
    kubernetes = [
        target("inference.llama-0", "sglang", "http://10.0.0.9:8000/metrics"),  # a name taken
        target("k.llama-0", "sglang", "http://10.0.0.2:8000/metrics"),  # an engine's instance
        target("dcgm-n1", "dcgm", "http://10.0.0.2:8000/metrics"),  # a GPU node may share it
        target("k.tgi-0", "tgi", "http://10.0.0.3:8000/metrics"),
    ]
    merged = merge(explicit, prometheus, kubernetes)
    assert [(t.name, t.kind) for t in merged] == [
        ("qwen", "vllm"),
        ("inference.llama-0", "vllm"),
        ("dcgm-n1", "dcgm"),
        ("k.tgi-0", "tgi"),
    ]


def test_a_target_no_longer_found_is_gone_once_stale_and_while_in_the_window() -> None:
    from kneepoint.status import gone_targets, stale_after
    from kneepoint.store.models import TargetRow

    fleet = config(DISCOVERY)
    now = 1_000_000.0
    limit = stale_after(fleet)

    def row(kind: str, last: float | None) -> TargetRow:
        return TargetRow(kind=kind, engine=None, last_scrape_at=last, last_success_at=last)

    rows = {
        "old": row("vllm", now - limit - 5),  # gone
        "older": row("vllm", now - limit - 50),  # gone longer
        "node": row("dcgm", now - limit - 1),  # a GPU node gone
        "fresh": row("vllm", now - limit + 1),  # still scraped by someone: not called gone
        "ancient": row("vllm", now - 700.0),  # before the window: not listed
        "never": row("vllm", None),
    }
    gone = gone_targets(rows, fleet, now, 600.0)
    assert [(g["name"], g["kind"], g["state"]) for g in gone] == [
        ("node", "gpu_node", "gone"),
        ("old", "replica", "gone"),
        ("older", "replica", "gone"),
    ]
    assert gone[1]["engine"] == "vllm" and gone[0]["engine"] is None
    # A target that is configured (or discovered) again is not gone.
    back = fleet.model_copy(
        update={
            "targets": [
                Target.model_validate({"name": "old", "kind": "vllm", "url": "http://h:1/"})
            ]
        }
    )
    assert [g["name"] for g in gone_targets(rows, back, now, 600.0)] == ["node", "older"]
