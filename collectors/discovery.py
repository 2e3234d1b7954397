"""Discovery through Prometheus: the targets Prometheus scrapes (its `/api/v1/targets`)
become kneepoint targets, replicas (vLLM) and GPU nodes (DCGM), named from their labels by
a template (`{namespace}.{pod}`). Run before every round in Prometheus mode, so targets
added to or removed from Prometheus are followed; a removed target's rows stay in the store
(its history), it is only no longer read. Explicit `targets:` win on a name or instance
conflict.
"""

from __future__ import annotations

import logging
import math
import re
import string
import threading
import time
from typing import Any

from kneepoint.config import Config, DiscoveryRule, Target
from kneepoint.secrets import SecretURL

log = logging.getLogger(__name__)
_VALID_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")


class MissingLabel(KeyError):
    """A template names a label the target does not have."""


def render(template: str, labels: dict[str, str]) -> str:
    """The template with each `{label}` replaced by the label's value."""
    out = []
    for text, field, _, _ in string.Formatter().parse(template):
        out.append(text)
        if field is not None:
            if field not in labels:
                raise MissingLabel(field)
            out.append(labels[field])
    return "".join(out)


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
    left out, with a warning."""
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
        if not _VALID_NAME.match(name) or len(name) > 200:
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
    return list(found.values())


def discovered_targets(config: Config, active_targets: list[dict[str, Any]]) -> list[Target]:
    """The explicit targets, then the discovered ones that conflict with none of them (by
    name, or by kind and `instance`)."""
    assert config.discovery is not None
    from collectors.prometheus_api import instance_of

    rules = config.discovery.prometheus
    merged = list(config.targets)
    names = {t.name for t in merged}
    instances: set[tuple[str, str]] = {(t.kind, instance_of(t)) for t in merged}
    for rule, kind in ((rules.replicas, "vllm"), (rules.gpu_nodes, "dcgm")):
        if rule is None:
            continue
        for target in targets_from(rule, kind, active_targets):
            if target.name in names or (kind, instance_of(target)) in instances:
                continue
            names.add(target.name)
            instances.add((kind, instance_of(target)))
            merged.append(target)
    return merged


def with_discovered(config: Config) -> Config:
    """The config with the targets Prometheus scrapes now added (see discovered_targets)."""
    if config.discovery is None or config.prometheus is None:
        return config
    from collectors.prometheus_api import PrometheusReader

    active = PrometheusReader(config.prometheus).active_targets()
    return config.model_copy(update={"targets": discovered_targets(config, active)})


# The last discovery of each source and discovery config: (when it was tried, its targets).
_last: dict[str, tuple[float, list[Target] | None]] = {}
_last_lock = threading.Lock()


def current(config: Config, max_age: float | None = None) -> Config:
    """The config with its discovered targets, discovered again when the last try is older
    than `max_age` (default: the scrape interval). Where Prometheus cannot be read, the last
    targets found are kept (explicit ones only, before any), with a warning: a Prometheus
    outage must not make every discovered replica vanish from the pages and the alerts."""
    if config.discovery is None or config.prometheus is None:
        return config
    from collectors.prometheus_api import PrometheusSourceError

    key = config.prometheus.url.reveal() + "\n" + config.discovery.model_dump_json()
    age = config.scrape_interval if max_age is None else max_age
    now = time.monotonic()
    with _last_lock:
        tried, targets = _last.get(key, (-math.inf, None))
    if now - tried >= age:
        try:
            targets = with_discovered(config).targets
        except PrometheusSourceError as error:
            log.warning("discovery: %s; the targets found before are kept", error)
        with _last_lock:
            _last[key] = (now, targets)
    return config if targets is None else config.model_copy(update={"targets": targets})
