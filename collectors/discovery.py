"""Discovery: targets found rather than listed. Through Prometheus, the targets it scrapes
(its `/api/v1/targets`) become kneepoint targets, replicas (vLLM) and GPU nodes (DCGM),
named from their labels by a template (`{namespace}.{pod}`); through the Kubernetes API
(collectors/kubernetes.py), the running pods a label selector picks, for direct scraping.
Found again before every scrape round (in both modes), so targets added or removed are
followed; a removed target's rows stay in the store (its history), it is only no longer read
and is shown as gone (kneepoint/status.py). Explicit `targets:` win on a name or instance
conflict. Each source keeps the last targets it found while it cannot be read.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from collectors.kubernetes import KubeconfigError, KubernetesApiError, connection, discover
from collectors.prometheus_api import PrometheusReader, PrometheusSourceError, instance_of
from collectors.target_names import MissingLabel, render, usable_name
from kneepoint.config import Config, DiscoveryRule, PrometheusDiscovery, Target
from kneepoint.secrets import SecretURL

log = logging.getLogger(__name__)
# What a source that cannot be read raises: its last targets are kept (see `current`).
SOURCE_ERRORS = (PrometheusSourceError, KubernetesApiError, KubeconfigError)


def _labels(active: dict[str, Any]) -> dict[str, str]:
    """A target's labels after relabelling, over its discovered ones (`__` meta left out)."""
    found = {
        k: str(v)
        for k, v in (active.get("discoveredLabels") or {}).items()
        if not k.startswith("__")
    }
    return found | {k: str(v) for k, v in (active.get("labels") or {}).items()}


def selected(rule: DiscoveryRule, active: dict[str, Any]) -> bool:
    labels = _labels(active)
    job = labels.get("job", active.get("scrapePool", ""))
    if rule.jobs and job not in rule.jobs:
        return False
    return all(labels.get(k) == v for k, v in rule.match.items())


def targets_from(
    rule: DiscoveryRule, kind: str, active_targets: list[dict[str, Any]]
) -> list[Target]:
    """The kneepoint targets of the active targets the rule selects, first of a name wins;
    one whose name cannot be made (a label missing, a character a name cannot hold) is
    left out, with a warning. In name order: Prometheus lists its targets in no stable order."""
    found: dict[str, Target] = {}
    for active in active_targets:
        if not selected(rule, active):
            continue
        labels = _labels(active)
        try:
            name = render(rule.name, labels)
        except MissingLabel as missing:
            log.warning(
                "discovery: target %s has no label %s for its name; left out",
                labels.get("instance", "?"),
                missing,
            )
            continue
        if not usable_name(name):
            log.warning("discovery: %r is not a usable target name; left out", name)
            continue
        if name in found:
            continue
        found[name] = Target(
            name=name,
            kind=kind,  # type: ignore[arg-type]
            url=SecretURL(str(active.get("scrapeUrl") or f"http://{labels.get('instance')}/")),
            instance=labels.get("instance"),
            pod=labels.get("pod"),
            namespace=labels.get("namespace"),
        )
    return sorted(found.values(), key=lambda target: target.name)


def discovered_targets(config: Config, active_targets: list[dict[str, Any]]) -> list[Target]:
    """The explicit targets, then those Prometheus's active targets give that conflict with
    none of them (by name, or by kind and `instance`)."""
    assert config.discovery is not None and config.discovery.prometheus is not None
    return merge(config.targets, from_prometheus(config.discovery.prometheus, active_targets))


def from_prometheus(
    rules: PrometheusDiscovery, active_targets: list[dict[str, Any]]
) -> list[Target]:
    found: list[Target] = []
    for rule, kind in ((rules.replicas, "vllm"), (rules.gpu_nodes, "dcgm")):
        if rule is not None:
            found.extend(targets_from(rule, kind, active_targets))
    return found


def merge(explicit: list[Target], *found: list[Target]) -> list[Target]:
    """The explicit targets, then each discovered one that conflicts with none before it
    (by name, or by its kind, replica or GPU node, and its `instance`)."""

    def key(target: Target) -> tuple[bool, str]:
        return (target.kind == "dcgm", instance_of(target))

    merged = list(explicit)
    names = {t.name for t in merged}
    instances = {key(t) for t in merged}
    for targets in found:
        for target in targets:
            if target.name in names or key(target) in instances:
                continue
            names.add(target.name)
            instances.add(key(target))
            merged.append(target)
    return merged


def with_discovered(config: Config) -> Config:
    """The config with the targets Prometheus scrapes now added (see discovered_targets),
    asked once, uncached. The collector uses `current` (cached, kept through an outage);
    tests/real/test_discovery.py uses this to read the fleet as Prometheus has it now."""
    if config.discovery is None or config.discovery.prometheus is None:
        return config
    if config.prometheus is None:
        return config
    active = PrometheusReader(config.prometheus).active_targets()
    return config.model_copy(update={"targets": discovered_targets(config, active)})


# The last discovery of each source and its config: (when it was tried, what it found, the
# last failure's message: one warning per outage, not one per round).
_last: dict[str, tuple[float, list[Target] | None, str | None]] = {}
_last_lock = threading.Lock()


def _sources(config: Config) -> list[tuple[str, Callable[[], list[Target]]]]:
    """Each configured source: its cache key and how to ask it."""
    found = config.discovery
    sources: list[tuple[str, Callable[[], list[Target]]]] = []
    if found is None:
        return sources
    if found.prometheus is not None and config.prometheus is not None:
        source, rules = config.prometheus, found.prometheus

        def prometheus() -> list[Target]:
            return from_prometheus(rules, PrometheusReader(source).active_targets())

        key = "prometheus\n" + source.url.reveal() + "\n" + rules.model_dump_json()
        sources.append((key, prometheus))
    if found.kubernetes is not None:
        pods = found.kubernetes
        sources.append(("kubernetes\n" + pods.model_dump_json(), lambda: discover(pods)))
    return sources


def current(config: Config, max_age: float | None = None) -> Config:
    """The config with its discovered targets, each source asked again when its last try is
    older than `max_age` (default: the scrape interval). Where a source cannot be read (or
    its kubeconfig cannot be used), the last targets it found are kept (none, before any),
    with one warning per outage: an outage of Prometheus or the Kubernetes API must not
    make every discovered replica vanish from the rounds, the pages and the alerts."""
    sources = _sources(config)
    if not sources:
        return config
    age = config.scrape_interval if max_age is None else max_age
    found: list[list[Target]] = []
    for key, ask in sources:
        now = time.monotonic()
        with _last_lock:
            tried, targets, failing = _last.get(key, (-math.inf, None, None))
        if now - tried >= age:
            try:
                targets = ask()
                if failing is not None:
                    log.warning("discovery: %s answers again", key.partition("\n")[0])
                failing = None
            except SOURCE_ERRORS as error:
                if str(error) != failing:
                    kept = (
                        f"the {len(targets)} targets found before are kept"
                        if targets
                        else "no targets found yet"
                    )
                    log.warning("discovery: %s; %s", error, kept)
                failing = str(error)
            with _last_lock:
                _last[key] = (now, targets, failing)
        found.append(targets or [])
    if all(not targets for targets in found):
        return config
    return config.model_copy(update={"targets": merge(config.targets, *found)})


def check(config: Config) -> None:
    """Raise the ConfigError that makes a source unusable (a bad kubeconfig, no service
    account), for commands that should fail at start rather than warn each round."""
    found = config.discovery
    if found is not None and found.kubernetes is not None:
        connection(found.kubernetes)
