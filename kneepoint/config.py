"""kneepoint.yaml: load, expand ${VAR}, validate, and fail with one sentence naming the key."""

from __future__ import annotations

import os
import re
import string
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from apscheduler.triggers.cron import CronTrigger
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from collectors.engines import ENGINES
from kneepoint.auth import Auth, Limits
from kneepoint.durations import parse_duration
from kneepoint.gpu_peaks import DEFAULT_DTYPE, DTYPES, GpuPeak, words
from kneepoint.secrets import HookURL, Secret, SecretURL

Duration = Annotated[float, BeforeValidator(parse_duration)]
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_GPU_REF = re.compile(r"[^/\s]+/\d+")


class ConfigError(ValueError):
    """The configuration cannot be used; the message is one sentence naming the key."""


class Strict(BaseModel):
    # hide_input_in_errors: a validation error's text never quotes the value it refused
    # (a secret's, maybe); `describe` reads only the message anyway.
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, hide_input_in_errors=True
    )


class Retention(Strict):
    raw: Duration = 48 * 3600.0
    minute: Duration = 35 * 86400.0
    hour: Duration = 400 * 86400.0
    # The logs beside the samples, pruned by the rollup job: settled notifications (every
    # state but pending) by their creation, alert state changes, silences after they ended,
    # scrape errors, and audit entries (kneepoint/audit.py) by their time.
    notifications: Duration = 30 * 86400.0
    alert_history: Duration = 90 * 86400.0
    silences: Duration = 30 * 86400.0
    scrape_errors: Duration = 7 * 86400.0
    audit: Duration = 400 * 86400.0

    @model_validator(mode="after")
    def _tiers_grow(self) -> Retention:
        if not self.raw <= self.minute <= self.hour:
            raise ValueError("raw, minute and hour retention must not shrink from tier to tier")
        for name in ("notifications", "alert_history", "silences", "scrape_errors", "audit"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} retention must be positive")
        return self


def _http_url(url: SecretURL) -> SecretURL:
    if not _HTTP_URL.match(url.reveal()):
        raise ValueError("must be an http:// or https:// URL without spaces")
    return url


_HTTP_URL = re.compile(r"^https?://\S+$")
# A URL that may carry credentials (user:password@, ?token=): a secret, shown redacted.
HttpURL = Annotated[SecretURL, AfterValidator(_http_url)]


# Target kinds that are inference engines (replicas), as opposed to a dcgm-exporter: every
# engine collectors/engines/ declares, and `auto` (the engine named by the first scrape).
ENGINE_KINDS: tuple[str, ...] = (*ENGINES, "auto")
if TYPE_CHECKING:  # the kinds are known only once the engine modules are found
    EngineKind = str
    TargetKind = str
else:  # pydantic checks a Literal of them, and its errors list them
    EngineKind = Literal[ENGINE_KINDS]
    TargetKind = Literal[(*ENGINE_KINDS, "dcgm")]


if TYPE_CHECKING:
    ComputeDtype = str
else:  # pydantic checks a Literal of them, and its errors list them
    ComputeDtype = Literal[DTYPES]


class GpuPeakEntry(Strict):
    """One `gpu_peaks:` entry: a GPU the built-in table lacks, or one whose figures it
    replaces (kneepoint/gpu_peaks.py). `match`: words every matching DCGM modelName holds
    (case ignored, whole words); `tflops`: dense (not sparse) peak TFLOPS per data type
    (TOPS for int8); `bandwidth_gb_s`: peak memory bandwidth in GB/s. Entries are tried in
    order, before the built-in table; the first that matches is the GPU's peak, whole."""

    match: Annotated[str, Field(min_length=1)]
    tflops: dict[ComputeDtype, Annotated[float, Field(gt=0)]]  # dense, per data type
    bandwidth_gb_s: Annotated[float, Field(gt=0)]

    @field_validator("match")
    @classmethod
    def _has_words(cls, match: str) -> str:
        if not words(match):
            raise ValueError("must hold a word of the GPU's name (letters or digits)")
        return match

    @field_validator("tflops")
    @classmethod
    def _some_dtype(cls, tflops: dict[str, float]) -> dict[str, float]:
        if not tflops:
            raise ValueError(f"must give a peak for one data type at least ({', '.join(DTYPES)})")
        return tflops

    def peak(self) -> GpuPeak:
        return GpuPeak(
            self.match, words(self.match), dict(self.tflops), self.bandwidth_gb_s, "config"
        )


class Target(Strict):
    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")]
    # An inference engine (a module of collectors/engines/: vllm, sglang, llamacpp, tgi,
    # trtllm), `auto` (the engine named by the first scrape's metric names) or a
    # dcgm-exporter.
    kind: TargetKind
    url: HttpURL
    gpus: list[str] = []
    headers: dict[str, Secret] = {}
    # With `prometheus:` set: the target's `instance` label there (default: URL's host:port).
    instance: str | None = None
    # The Kubernetes pod (and namespace) the replica runs in: its GPUs are then the ones
    # dcgm-exporter labels with that pod, when `gpus:` does not list them. Discovery sets
    # them from the target's `pod` and `namespace` labels.
    pod: str | None = None
    namespace: str | None = None
    timeout: Duration = 5.0
    max_bytes: Annotated[int, Field(gt=0)] = 8 * 1024 * 1024
    max_series: Annotated[int, Field(gt=0)] = 20_000  # more: the target is down, with why
    # The data type its MFU is judged at (else the config's compute_dtype), and its GPUs'
    # model (DCGM's modelName spelling) where no dcgm-exporter reports them.
    compute_dtype: ComputeDtype | None = None
    gpu_model: Annotated[str, Field(min_length=1)] | None = None
    # The engine's per-step token budget (vLLM: --max-num-batched-tokens), which no engine
    # exports: with it, the saturation verdict's "token budget full" is judged against it;
    # without it, inferred from the tokens-per-step histogram (docs/explanation/saturation.md).
    max_num_batched_tokens: Annotated[int, Field(gt=0)] | None = None

    @field_validator("gpus")
    @classmethod
    def _gpu_refs(cls, gpus: list[str]) -> list[str]:
        for ref in gpus:
            if not _GPU_REF.fullmatch(ref):
                raise ValueError(f"{ref!r} is not a GPU reference like gpu-node-7/0")
        return gpus


class PrometheusSource(Strict):
    """Read the targets' series from a Prometheus-compatible API instead of scraping them."""

    url: HttpURL
    vllm_selector: Annotated[str, Field(pattern=r"^(\{.*\})?$")] = ""
    dcgm_selector: Annotated[str, Field(pattern=r"^(\{.*\})?$")] = ""
    headers: dict[str, Secret] = {}  # e.g. X-Scope-OrgID for Mimir, or an Authorization
    timeout: Duration = 10.0
    # After an outage, read back at most this far (older scrapes are skipped, and the gap
    # logged), in range queries of at most `chunk` each: a Prometheus refuses a query that
    # loads too many samples, and one unbounded catch-up would then fail every round.
    lookback: Annotated[float, Field(gt=0), BeforeValidator(parse_duration)] = 3600.0
    chunk: Annotated[float, Field(gt=0), BeforeValidator(parse_duration)] = 600.0


_NAME_TEXT = re.compile(r"^[A-Za-z0-9_.:-]*$")


def _template(template: str) -> str:
    """A target-name template: `{label}` fields joined by text a target name may hold."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as error:
        raise ValueError(f"is not a valid template ({error})") from None
    fields = [field for _, field, _, _ in parts if field is not None]
    if not fields:
        raise ValueError("must name at least one label, like {namespace}.{pod}")
    for text, field, spec, conversion in parts:
        if not _NAME_TEXT.match(text):
            raise ValueError(
                f"holds {text!r}, which a target name cannot (only letters, digits and _ . : -)"
            )
        if field is not None and (spec or conversion or not re.fullmatch(r"\w+", field)):
            raise ValueError(f"field {{{field}}} must be a plain label name")
    return template


NameTemplate = Annotated[str, AfterValidator(_template)]


class DiscoveryRule(Strict):
    """Which of Prometheus's active targets to take (all `jobs`, when listed, and every
    `match` label equal) and how to name them from their labels."""

    jobs: list[str] = []
    match: dict[str, str] = {}
    name: NameTemplate

    @model_validator(mode="after")
    def _selective(self) -> DiscoveryRule:
        if not self.jobs and not self.match:
            raise ValueError("needs jobs or match, so it does not take every target")
        return self


class PrometheusDiscovery(Strict):
    """Targets from Prometheus's /api/v1/targets: replicas (vLLM) and GPU nodes (DCGM)."""

    replicas: DiscoveryRule | None = None
    gpu_nodes: DiscoveryRule | None = None


# A label selector as the Kubernetes API takes it: requirements joined by commas, each
# `key`, `!key`, `key=value`, `key==value`, `key!=value`, `key in (a,b)` or `key notin (a,b)`.
_SEGMENT = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
_LABEL_KEY = rf"(?:{_SEGMENT}/)?{_SEGMENT}"
_LABEL_VALUE = rf"(?:{_SEGMENT})?"
_REQUIREMENT = re.compile(
    rf"\s*(?:{_LABEL_KEY}\s+(?:in|notin)\s*\(\s*{_LABEL_VALUE}(?:\s*,\s*{_LABEL_VALUE})*\s*\)"
    rf"|{_LABEL_KEY}\s*(?:==|=|!=)\s*{_LABEL_VALUE}|!?{_LABEL_KEY})\s*"
)
_PORT_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,13})$")


def _selector(selector: str) -> str:
    """A label selector the Kubernetes API accepts (checked here, so a typo is a config
    error rather than every round's refused request)."""
    rest = selector
    while True:
        match = _REQUIREMENT.match(rest)
        if match is None or not match.group(0).strip():
            raise ValueError(
                "is not a label selector like app=vllm or app in (vllm,sglang),tier!=canary"
            )
        rest = rest[match.end() :]
        if not rest:
            return selector
        if not rest.startswith(","):
            raise ValueError(
                "is not a label selector like app=vllm or app in (vllm,sglang),tier!=canary"
            )
        rest = rest[1:]


def _port(port: int | str) -> int | str:
    if isinstance(port, int):
        if not 1 <= port <= 65535:
            raise ValueError("must be a port number (1 to 65535) or a container port's name")
    elif not _PORT_NAME.match(port) or port.isdigit():
        raise ValueError("must be a port number or a container port's name (like metrics)")
    return port


class KubernetesRule(Strict):
    """Which running pods to take (in `namespaces`, every one when empty; those the label
    `selector` selects), where their metrics are (`scheme`://podIP:`port``path`, the port a
    number or a container port's name), and how to name them: a template of the pod's labels
    and `namespace`, `pod` and `node`."""

    namespaces: list[Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]] = []
    selector: Annotated[str, AfterValidator(_selector)]
    port: Annotated[int | str, AfterValidator(_port)]
    path: Annotated[str, Field(pattern=r"^/\S*$")] = "/metrics"
    scheme: Literal["http", "https"] = "http"
    name: NameTemplate


class KubernetesReplicas(KubernetesRule):
    # The replicas' engine (a target kind), or `auto`: told by the first scrape.
    engine: EngineKind = "vllm"


class KubernetesDiscovery(Strict):
    """Targets from the Kubernetes API's pods (collectors/kubernetes.py): replicas and GPU
    nodes (dcgm-exporter pods). `kubeconfig` omitted: the pod's service account."""

    kubeconfig: str | None = None
    context: str | None = None  # of the kubeconfig; omitted: its current-context
    timeout: Annotated[float, Field(gt=0), BeforeValidator(parse_duration)] = 10.0
    replicas: KubernetesReplicas | None = None
    gpu_nodes: KubernetesRule | None = None

    @model_validator(mode="after")
    def _something(self) -> KubernetesDiscovery:
        if self.replicas is None and self.gpu_nodes is None:
            raise ValueError("needs replicas or gpu_nodes")
        if self.context is not None and self.kubeconfig is None:
            raise ValueError("context is a kubeconfig's: give kubeconfig too")
        return self


class Discovery(Strict):
    """Where targets are found: Prometheus's targets, the Kubernetes API's pods, or both."""

    prometheus: PrometheusDiscovery | None = None
    kubernetes: KubernetesDiscovery | None = None

    @model_validator(mode="after")
    def _a_source(self) -> Discovery:
        if self.prometheus is None and self.kubernetes is None:
            raise ValueError("needs prometheus or kubernetes (where targets are found)")
        return self


class ApiReference(Strict):
    name: str = "hosted-api"
    input_per_mtok: Annotated[float, Field(ge=0)] = 0.15
    output_per_mtok: Annotated[float, Field(ge=0)] = 0.60


class Pricing(Strict):
    gpu_hour: dict[str, Annotated[float, Field(ge=0)]] = {"default": 2.0}
    replica_gpu_hour: dict[str, Annotated[float, Field(ge=0)]] = {}
    extra_monthly: Annotated[float, Field(ge=0)] = 0.0
    api_reference: ApiReference = ApiReference()
    # USD per 1M served tokens the fleet should stay under (the `cost-over-budget` alert)
    budget_per_million_tokens: Annotated[float, Field(gt=0)] | None = None


class Slo(Strict):
    """A latency SLO (`metric` ≤ `threshold` for `objective` of requests) or, with `kind:
    availability`, the share of requests that did not fail and time the engine was not
    stalled (alerts/slo.py)."""

    name: str
    kind: Literal["latency", "availability"] = "latency"
    metric: Literal["ttft", "itl", "e2e", "queue"] | None = None  # latency only
    threshold: Duration | None = None  # latency only
    objective: Annotated[float, Field(gt=0.0, lt=1.0)]
    window: Duration = 30 * 86400.0
    channels: list[str] = []  # where its burn-rate alerts go

    @model_validator(mode="after")
    def _kind_fields(self) -> Slo:
        if self.kind == "latency" and (self.metric is None or self.threshold is None):
            raise ValueError("a latency SLO needs metric and threshold")
        if self.kind == "availability" and (self.metric is not None or self.threshold is not None):
            raise ValueError(
                "an availability SLO takes no metric or threshold (it counts failed requests "
                "and stalled time)"
            )
        return self


def _cron(expression: str) -> str:
    """A five-field crontab line (UTC) APScheduler reads; day-of-week by name only."""
    fields = expression.split()
    if len(fields) != 5:
        raise ValueError(
            f"cron {expression!r} must have five fields (minute hour day month day-of-week)"
        )
    if re.search(r"\d", fields[4]):
        # APScheduler 3 counts 0 as Monday where crontab counts it as Sunday: names only.
        raise ValueError(
            f"cron {expression!r} must name days of the week (MON-FRI, SUN), not number them"
        )
    try:
        CronTrigger.from_crontab(expression, timezone="UTC")
    except ValueError as error:
        raise ValueError(f"cron {expression!r} is not valid ({error})") from None
    return expression


class Maintenance(Strict):
    """A maintenance window (alerts/maintenance.py): one-off (`start`, `end`, ISO 8601 times,
    UTC unless they say otherwise) or recurring (`cron`, UTC, and `duration`), over `replicas`
    (all when omitted). While it lasts its replicas' alerts are evaluated but not sent, and
    its time is left out of every SLO's error budget."""

    name: Annotated[str, Field(min_length=1)]
    start: datetime | None = None
    end: datetime | None = None
    cron: Annotated[str, AfterValidator(_cron)] | None = None
    duration: Annotated[float, Field(gt=0), BeforeValidator(parse_duration)] | None = None
    replicas: list[str] = []

    @field_validator("start", "end")
    @classmethod
    def _utc(cls, moment: datetime | None) -> datetime | None:
        if moment is not None and moment.tzinfo is None:
            return moment.replace(tzinfo=UTC)
        return moment

    @model_validator(mode="after")
    def _one_kind(self) -> Maintenance:
        one_off = self.start is not None or self.end is not None
        recurring = self.cron is not None or self.duration is not None
        if one_off and recurring:
            raise ValueError(
                "is either one-off (start, end) or recurring (cron, duration), not both"
            )
        if one_off:
            if self.start is None or self.end is None:
                raise ValueError("a one-off window needs both start and end")
            if self.end <= self.start:
                raise ValueError("must end after it starts")
        elif recurring:
            if self.cron is None or self.duration is None:
                raise ValueError("a recurring window needs both cron and duration")
        else:
            raise ValueError("needs start and end (one-off) or cron and duration (recurring)")
        return self


ChannelType = Literal[
    "slack",
    "discord",
    "teams",
    "feishu",
    "dingtalk",
    "wecom",
    "telegram",
    "pagerduty",
    "webhook",
    "alertmanager",
]


class Channel(Strict):
    name: str
    type: ChannelType
    # Secrets: never shown (kneepoint/secrets.py); the URL as scheme://host/… at most.
    url: HookURL | None = None
    secret: Secret | None = None
    token: Secret | None = None
    chat_id: str | None = None
    routing_key: Secret | None = None
    headers: dict[str, Secret] = {}
    # A firing message not delivered within this long is dropped as stale (state "expired");
    # resolutions and reports are never dropped.
    max_age: Annotated[float, Field(gt=0), BeforeValidator(parse_duration)] = 3600.0

    @field_validator("url")
    @classmethod
    def _sendable(cls, url: HookURL | None) -> HookURL | None:
        # A channel URL is a secret (its path or query is the token): the error never
        # quotes it, only what is wrong with it.
        if url is not None:
            problem = url_problem(url.reveal())
            if problem:
                raise ValueError(problem)
        return url


_HOST = re.compile(r"^[A-Za-z0-9._-]+$|^[0-9A-Fa-f:.]+$")


def url_problem(url: str) -> str | None:
    """Why httpx could not send to `url` (None: it can), in words that do not quote it."""
    import httpx

    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError) as error:
        reason = str(error).split("'")[0].rstrip(" ,:.") or type(error).__name__
        return f"is not a valid URL ({reason})"
    if not parsed.scheme:
        return "has no scheme: it must start with https:// or http://"
    if parsed.scheme not in ("http", "https"):
        return "must be an http:// or https:// URL (its scheme is not supported)"
    host = parsed.raw_host.decode("ascii", "replace")
    if not host:
        return "has no host"
    if not _HOST.match(host):
        return "has a host name that cannot be looked up (a space or bracket in it?)"
    return None


class Rule(Strict):
    """An alert rule: `metric` `op` `threshold` held for `for:` fires (alerts/lifecycle.py).

    `no_data` says what an evaluation without a value (the target stopped answering,
    scraping stopped, nothing in the window) does, since "no data" is not "all is well":
    `keep` (default) holds the alert's state: a firing alert stays firing, its history and
    messages say "no data", and a pending one keeps its `for:` clock; `resolve` resolves it,
    saying "no data"; `alert` counts no data as a breach, so it fires after `for:`."""

    name: str
    metric: str
    op: Literal[">", ">=", "<", "<=", "==", "!="]
    threshold: float
    for_: Duration = Field(0.0, alias="for")
    resolve_threshold: float | None = None
    severity: Literal["page", "ticket", "info"] = "ticket"
    scope: Literal["replica", "fleet"] = "replica"
    labels: dict[str, str] = {}
    runbook: str = ""
    channels: list[str] = []
    no_data: Literal["keep", "resolve", "alert"] = "keep"


class Heartbeat(Strict):
    """A dead-man's switch (collectors/heartbeat.py): `url` is requested every `interval`
    while scraping, evaluation and the database are healthy, and not while they are not,
    so a service watching for the requests (healthchecks.io, Alertmanager's Watchdog
    receiver) notices a dead, stuck or full-disk kneepoint. The URL is a secret (its path is
    the check's key): it is never printed whole."""

    url: HookURL
    interval: Annotated[float, Field(gt=0), BeforeValidator(parse_duration)] = 60.0

    @field_validator("url")
    @classmethod
    def _requestable(cls, url: HookURL) -> HookURL:
        problem = url_problem(url.reveal())
        if problem:
            raise ValueError(problem)
        return url


class Collector(Strict):
    """Several `kneepoint collect` processes on one PostgreSQL database (collectors/cluster.py):
    each registers and beats every lease/3; one not seen for `lease` is gone and its targets
    move to the others."""

    lease: Annotated[float, Field(gt=0), BeforeValidator(parse_duration)] = 15.0


class Report(Strict):
    schedule: str = "0 9 * * MON"
    channels: list[str] = []
    output_dir: str = "reports"

    @field_validator("schedule")
    @classmethod
    def _cron(cls, schedule: str) -> str:
        CronTrigger.from_crontab(schedule)
        return schedule


class Config(Strict):
    # May carry a PostgreSQL password: shown with user info and query values masked; the
    # store reveals it only to connect.
    database: SecretURL = SecretURL("sqlite:///kneepoint.db")
    scrape_interval: Duration = 15.0
    evaluation_interval: Duration = 15.0
    repeat_interval: Duration = 4 * 3600.0  # remind of a firing alert this often (0: never)
    retention: Retention = Retention()
    dashboard_url: str = "http://localhost:8501"
    targets: list[Target] = []
    prometheus: PrometheusSource | None = None
    discovery: Discovery | None = None
    pricing: Pricing = Pricing()
    # GPU peaks beside the built-in table (kneepoint/gpu_peaks.py), tried first, and the data
    # type FLOPs are judged at: bf16 by default, since vLLM's FLOPs estimate does not say its
    # dtype and most served models run in bf16 (a target's compute_dtype overrides it).
    gpu_peaks: list[GpuPeakEntry] = []
    compute_dtype: ComputeDtype = DEFAULT_DTYPE
    slos: list[Slo] = []
    maintenance: list[Maintenance] = []  # windows excluded from budgets, their alerts muted
    channels: list[Channel] = []
    rules: list[Rule] = []
    report: Report = Report()
    heartbeat: Heartbeat | None = None
    collector: Collector = Collector()  # high availability on PostgreSQL (collectors/cluster.py)
    # Sign-in and roles (kneepoint/auth.py). Unset: the app listens on loopback only.
    auth: Auth | None = None
    limits: Limits = Limits()

    @model_validator(mode="after")
    def _references(self) -> Config:
        _unique("targets", [t.name for t in self.targets])
        _unique("channels", [c.name for c in self.channels])
        _unique("slos", [s.name for s in self.slos])
        known = {c.name for c in self.channels}
        for index, rule in enumerate(self.rules):
            for channel in rule.channels:
                if channel not in known:
                    raise ValueError(f"rules[{index}].channels names unknown channel {channel!r}")
        for index, slo in enumerate(self.slos):
            for channel in slo.channels:
                if channel not in known:
                    raise ValueError(f"slos[{index}].channels names unknown channel {channel!r}")
        _unique("maintenance", [m.name for m in self.maintenance])
        replicas = {t.name for t in self.targets if t.kind in ENGINE_KINDS}
        for index, window in enumerate(self.maintenance):
            for name in window.replicas:
                if self.targets and self.discovery is None and name not in replicas:
                    raise ValueError(
                        f"maintenance[{index}].replicas names unknown replica {name!r}"
                    )
        for channel in self.report.channels:
            if channel not in known:
                raise ValueError(f"report.channels names unknown channel {channel!r}")
        for index, target in enumerate(self.targets):
            if target.gpus and target.kind == "dcgm":
                raise ValueError(f"targets[{index}].gpus is only for engine targets, not dcgm")
            if target.kind == "dcgm" and (target.gpu_model or target.compute_dtype):
                raise ValueError(
                    f"targets[{index}]: gpu_model and compute_dtype are for engine targets, "
                    "not dcgm"
                )
            if self.prometheus is not None and target.kind not in ("vllm", "dcgm"):
                raise ValueError(
                    f"targets[{index}].kind {target.kind} cannot be read through prometheus: "
                    "(only vllm and dcgm targets can); leave prometheus: out to scrape it"
                )
        found = self.discovery
        if found is not None and found.prometheus is not None and self.prometheus is None:
            raise ValueError(
                "discovery.prometheus needs prometheus: (the source its targets are read from)"
            )
        pods = found.kubernetes.replicas if found and found.kubernetes else None
        if pods is not None and self.prometheus is not None and pods.engine != "vllm":
            raise ValueError(
                f"discovery.kubernetes.replicas.engine {pods.engine} cannot be read through "
                "prometheus: (only vllm can); leave prometheus: out to scrape the pods"
            )
        if self.scrape_interval <= 0:
            raise ValueError("scrape_interval must be positive")
        return self

    def target(self, name: str) -> Target:
        return next(t for t in self.targets if t.name == name)

    def peaks(self) -> tuple[GpuPeak, ...]:
        """The config's gpu_peaks, in order, as kneepoint.gpu_peaks.find reads them."""
        return tuple(entry.peak() for entry in self.gpu_peaks)


class Settings(BaseSettings):
    """Where the config lives, from the environment (KNEEPOINT_CONFIG)."""

    model_config = SettingsConfigDict(env_prefix="KNEEPOINT_")
    config: Path = Path("kneepoint.yaml")


def _unique(key: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{key} has two entries named {name!r}")
        seen.add(name)


def config_path(explicit: str | Path | None = None) -> Path:
    """`--config FILE`, else $KNEEPOINT_CONFIG, else ./kneepoint.yaml."""
    return Path(explicit) if explicit else Settings().config


def load_config(path: str | Path | None = None, environ: dict[str, str] | None = None) -> Config:
    """Read, expand and validate a config file; raise ConfigError with one clear sentence."""
    file = config_path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"cannot read config {file}: {error.strerror or error}") from error
    return parse_config(text, source=str(file), environ=environ)


def parse_config(
    text: str, source: str = "kneepoint.yaml", environ: dict[str, str] | None = None
) -> Config:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(error, "problem", None) or _first_line(error)
        raise ConfigError(f"{source}: not valid YAML{where}: {problem}") from error
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of keys")
    expanded = _expand(raw, os.environ if environ is None else environ, source, "")
    try:
        return Config.model_validate(expanded)
    except ValidationError as error:
        raise ConfigError(f"{source}: {describe(error)}") from None


def _expand(value: Any, environ: Any, source: str, key: str) -> Any:
    if isinstance(value, dict):
        return {k: _expand(v, environ, source, _join(key, str(k))) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, environ, source, f"{key}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in environ:
            return str(environ[name])
        if default is not None:
            return default
        raise ConfigError(f"{source}: {key} uses ${{{name}}}, which is not set in the environment")

    return _VARIABLE.sub(substitute, value)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def describe(error: ValidationError) -> str:
    """The first problem of a validation error as `key.path: what is wrong`."""
    first = error.errors()[0]
    location = ""
    for part in first["loc"]:
        location += (
            f"[{part}]" if isinstance(part, int) else (f".{part}" if location else str(part))
        )
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "is not a known key"
    elif first["type"] == "missing":
        message = "is required"
    if not location:
        return message
    return f"{location}: {message}"


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0]
