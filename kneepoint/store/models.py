"""Tables, designed for time series: one wide row per replica and per GPU per scrape.

Counters are stored cumulative, exactly as scraped; gauges as scraped. Rollups thin raw rows
to one per minute and later one per hour (keeping the sample before any counter reset, so
increases over any window stay exact) and replace gauges by the bucket's mean and peak.
"""

from __future__ import annotations

from sqlalchemy import Boolean, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from kneepoint.samples import HISTOGRAMS, LOAD_HISTOGRAMS, REPLICA_COUNTERS

RAW, MINUTE, HOUR = 0, 60, 3600


class Base(DeclarativeBase):
    pass


class TargetRow(Base):
    """A configured target and its health as of the last scrape."""

    __tablename__ = "targets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    kind: Mapped[str] = mapped_column(String(16))
    url: Mapped[str] = mapped_column(Text)
    up: Mapped[bool | None] = mapped_column(Boolean)
    last_scrape_at: Mapped[float | None] = mapped_column(Float)
    last_success_at: Mapped[float | None] = mapped_column(Float)
    last_error: Mapped[str | None] = mapped_column(Text)
    consecutive_failures: Mapped[int] = mapped_column(Integer, default=0)
    # Samples refused for not being newer than the last stored one (a clock stepped back).
    samples_refused: Mapped[int | None] = mapped_column(Integer, default=0)
    generation: Mapped[str | None] = mapped_column(String(16))
    # The engine of the latest sample (the kind, or for `auto` the one detected) and what it
    # cannot give: JSON {quantity: reason} (kneepoint/samples.py QUANTITIES).
    engine: Mapped[str | None] = mapped_column(String(16))
    # When that engine was first seen (epoch seconds: the first sample of the current run of
    # one engine; collectors/collect.py resets it when the engine changes). None: not known
    # (stored before migration 0018 with no configuration history), read as long ago. An
    # alert whose metric the new engine does not expose follows its rule's `no_data` until
    # the new engine has been seen for the rule's `for` (alerts/lifecycle.py).
    engine_since: Mapped[float | None] = mapped_column(Float)
    unavailable: Mapped[str | None] = mapped_column(Text)
    engines: Mapped[int | None] = mapped_column(Integer)
    model_names: Mapped[str | None] = mapped_column(Text)
    cache_dtype: Mapped[str | None] = mapped_column(String(32))
    block_size: Mapped[int | None] = mapped_column(Integer)
    num_gpu_blocks: Mapped[int | None] = mapped_column(Integer)
    capacity_tokens: Mapped[int | None] = mapped_column(Integer)
    prefix_caching: Mapped[bool | None] = mapped_column(Boolean)
    gpu_memory_utilization: Mapped[float | None] = mapped_column(Float)
    # The latest scrape's LoRA adapters, JSON (samples.ReplicaSample.lora); None without LoRA.
    lora_adapters: Mapped[str | None] = mapped_column(Text)


class ScrapeErrorRow(Base):
    """A failed scrape: kept for the raw retention so down time can be shown."""

    __tablename__ = "scrape_errors"

    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id"), primary_key=True)
    ts: Mapped[float] = mapped_column(Float, primary_key=True)
    error: Mapped[str] = mapped_column(Text)


class HistogramLayoutRow(Base):
    """Bucket upper bounds, stored once and referenced by every encoded histogram."""

    __tablename__ = "histogram_layouts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    bounds: Mapped[str] = mapped_column(Text, unique=True)


class ReplicaSampleRow(Base):
    __tablename__ = "replica_samples"
    __table_args__ = ({"sqlite_with_rowid": False},)

    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id"), primary_key=True)
    ts: Mapped[float] = mapped_column(Float, primary_key=True)
    resolution: Mapped[int] = mapped_column(Integer, default=RAW)
    engines: Mapped[int | None] = mapped_column(Integer)
    kv_cache_usage: Mapped[float | None] = mapped_column(Float)
    kv_cache_usage_mean: Mapped[float | None] = mapped_column(Float)
    kv_cache_usage_peak: Mapped[float | None] = mapped_column(Float)
    requests_running: Mapped[float | None] = mapped_column(Float)
    requests_running_peak: Mapped[float | None] = mapped_column(Float)
    requests_waiting: Mapped[float | None] = mapped_column(Float)
    requests_waiting_peak: Mapped[float | None] = mapped_column(Float)
    requests_waiting_capacity: Mapped[float | None] = mapped_column(Float)
    requests_swapped: Mapped[float | None] = mapped_column(Float)
    prefix_cache_hit_rate_gauge: Mapped[float | None] = mapped_column(Float)
    spec_decode_acceptance_length_gauge: Mapped[float | None] = mapped_column(Float)
    spec_decode_acceptance_rate_gauge: Mapped[float | None] = mapped_column(Float)
    # samples.REPLICA_LAST_GAUGES: the last sample's in a rollup, never averaged.
    process_start_time: Mapped[float | None] = mapped_column(Float)
    sleep_level: Mapped[float | None] = mapped_column(Float)
    lora_adapters_running: Mapped[float | None] = mapped_column(Float)
    lora_adapters_waiting: Mapped[float | None] = mapped_column(Float)
    kv_offload_usage: Mapped[float | None] = mapped_column(Float)
    accepted_per_position: Mapped[str | None] = mapped_column(Text)


for _counter in REPLICA_COUNTERS:
    setattr(ReplicaSampleRow, _counter, mapped_column(_counter, Float, nullable=True))
for _histogram in (*HISTOGRAMS, *LOAD_HISTOGRAMS):
    setattr(ReplicaSampleRow, f"hist_{_histogram}", mapped_column(f"hist_{_histogram}", Text))


class GpuRow(Base):
    """A GPU's identity; its readings are in gpu_samples."""

    __tablename__ = "gpus"
    __table_args__ = (UniqueConstraint("target_id", "host", "gpu_index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id"))
    host: Mapped[str] = mapped_column(String(200))
    gpu_index: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str | None] = mapped_column(String(64))
    model: Mapped[str | None] = mapped_column(String(100))
    pod: Mapped[str | None] = mapped_column(String(200))
    namespace: Mapped[str | None] = mapped_column(String(200))


GPU_READINGS = (
    "utilization",
    "gr_engine_active",
    "sm_active",
    "tensor_active",
    "dram_active",
    "power_watts",
    "temperature_c",
    "memory_temperature_c",
    "fb_used_mib",
    "fb_free_mib",
)


class GpuSampleRow(Base):
    __tablename__ = "gpu_samples"
    __table_args__ = ({"sqlite_with_rowid": False},)

    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id"), primary_key=True)
    ts: Mapped[float] = mapped_column(Float, primary_key=True)
    resolution: Mapped[int] = mapped_column(Integer, default=RAW)
    energy_mj: Mapped[float | None] = mapped_column(Float)
    xid_error: Mapped[float | None] = mapped_column(Float)
    # dcgm-exporter's clock-event (throttle) reasons, NVML's bitmask: kept as the last
    # sample's, never averaged (the timeline reads throttling and power capping from it).
    clock_events: Mapped[float | None] = mapped_column(Float)


for _reading in GPU_READINGS:
    setattr(GpuSampleRow, _reading, mapped_column(_reading, Float, nullable=True))


class JobHealthRow(Base):
    """Each scheduled job's last run and last error: the collector's own health."""

    __tablename__ = "job_health"

    job_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    last_run_at: Mapped[float | None] = mapped_column(Float)
    last_success_at: Mapped[float | None] = mapped_column(Float)
    last_error: Mapped[str | None] = mapped_column(Text)
    runs: Mapped[int] = mapped_column(Integer, default=0)
    failures: Mapped[int] = mapped_column(Integer, default=0)


Index("ix_scrape_errors_ts", ScrapeErrorRow.ts)


class RunRow(Base):
    """A load-test run (a sweep or an imported result), one per label and model."""

    __tablename__ = "runs"
    __table_args__ = (UniqueConstraint("label", "model"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    label: Mapped[str] = mapped_column(String(200))
    model: Mapped[str] = mapped_column(String(300))
    source: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[float] = mapped_column(Float)
    notes: Mapped[str] = mapped_column(Text, default="{}")


class RunPointRow(Base):
    """One concurrency step of a run; its measures as JSON (the run model's Point)."""

    __tablename__ = "run_points"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    concurrency: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[str] = mapped_column(Text)


class AlertRow(Base):
    """Each rule-and-replica alert's current state (alerts/lifecycle.py)."""

    __tablename__ = "alerts"

    fingerprint: Mapped[str] = mapped_column(String(32), primary_key=True)
    rule: Mapped[str] = mapped_column(String(200))
    replica: Mapped[str] = mapped_column(String(200))
    state: Mapped[str] = mapped_column(String(16))
    value: Mapped[float | None] = mapped_column(Float)
    threshold: Mapped[float] = mapped_column(Float)
    pending_since: Mapped[float | None] = mapped_column(Float)
    fired_at: Mapped[float | None] = mapped_column(Float)
    resolved_at: Mapped[float | None] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    notified_at: Mapped[float | None] = mapped_column(Float)  # the last firing news sent


class AlertHistoryRow(Base):
    """Every state change of every alert, kept."""

    __tablename__ = "alert_history"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(32), index=True)
    rule: Mapped[str] = mapped_column(String(200))
    replica: Mapped[str] = mapped_column(String(200))
    ts: Mapped[float] = mapped_column(Float, index=True)
    before: Mapped[str | None] = mapped_column(String(16))
    after: Mapped[str] = mapped_column(String(16))
    value: Mapped[float | None] = mapped_column(Float)
    # Why there is no value beyond "no data": the replica's engine does not expose the
    # rule's quantity ("not exposed by llama.cpp since …"), which ended the alert.
    note: Mapped[str | None] = mapped_column(Text)


class NotificationRow(Base):
    """The outbox: one alert's news for one channel, kept until delivered or refused."""

    __tablename__ = "notifications"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    channel: Mapped[str] = mapped_column(String(200), index=True)
    fingerprint: Mapped[str] = mapped_column(String(32))
    notice: Mapped[str] = mapped_column(Text)  # the Notice, as JSON
    state: Mapped[str] = mapped_column(String(16), index=True)  # pending | sent | failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[float] = mapped_column(Float)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)
    sent_at: Mapped[float | None] = mapped_column(Float)
    # The lease of the sender that took the row (alerts/outbox.py): no one else sends it
    # before `claimed_until`; an expired lease (a sender that died) is taken over.
    claimed_by: Mapped[str | None] = mapped_column(String(64))
    claimed_until: Mapped[float | None] = mapped_column(Float)
    # Set when a sender takes the row, cleared when an answer says it was not delivered:
    # still set at the next claim, the receiver may have it already (a crash, a timeout).
    maybe_sent: Mapped[bool | None] = mapped_column(Boolean, default=False)
    resends: Mapped[int | None] = mapped_column(Integer, default=0)  # possible duplicates
    # The fingerprints of the alerts it carries, space-separated (a group carries several).
    alert_keys: Mapped[str | None] = mapped_column(Text)


class SilenceRow(Base):
    """A silence: alerts whose labels match every matcher send nothing while it lasts."""

    __tablename__ = "silences"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    matchers: Mapped[str] = mapped_column(Text)  # JSON {label: value}
    starts_at: Mapped[float] = mapped_column(Float)
    ends_at: Mapped[float] = mapped_column(Float)
    author: Mapped[str] = mapped_column(String(200))
    comment: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)


# Summary tiers kept beside the sample rows: one row per 5 minutes and per hour, so a long
# range reads a few hundred rows per series instead of thousands (store/rollup.py).
SUMMARY_TIERS = (300, 3600)


class ReplicaRollupRow(Base):
    """A replica's rows thinned to one per bucket of `resolution` seconds: the bucket's last
    sample (counters exact), gauges as the bucket's mean and peak, plus the seconds it spent
    saturated. Its columns are those of replica_samples, added below."""

    __tablename__ = "replica_rollups"
    __table_args__ = ({"sqlite_with_rowid": False},)

    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id"), primary_key=True)
    resolution: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(Float, primary_key=True)
    # Of the time since the previous kept row, the seconds with KV occupancy above the
    # saturation threshold: the mean of a bucket cannot tell a saturated minute.
    saturated_seconds: Mapped[float | None] = mapped_column(Float)
    # Whether the row's own sample was above it: that decides the span to the next row.
    ends_saturated: Mapped[bool | None] = mapped_column(Boolean)


class GpuRollupRow(Base):
    """A GPU's rows thinned like replica_rollups; its columns are those of gpu_samples."""

    __tablename__ = "gpu_rollups"
    __table_args__ = ({"sqlite_with_rowid": False},)

    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id"), primary_key=True)
    resolution: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(Float, primary_key=True)


for _rollup, _samples in ((ReplicaRollupRow, ReplicaSampleRow), (GpuRollupRow, GpuSampleRow)):
    for _column in _samples.__table__.columns:
        if _column.name not in _rollup.__table__.columns:
            setattr(_rollup, _column.name, mapped_column(_column.name, _column.type))


class RollupProgressRow(Base):
    """How far each summary tier reaches: its buckets before `until` are written."""

    __tablename__ = "rollup_progress"

    table_name: Mapped[str] = mapped_column(String(64), primary_key=True)
    resolution: Mapped[int] = mapped_column(Integer, primary_key=True)
    until: Mapped[float] = mapped_column(Float)


class AuditRow(Base):
    """One entry of the audit trail: a mutation, a sign-in or a refusal (kneepoint/audit.py)."""

    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_ts", "ts"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(Float)
    actor: Mapped[str] = mapped_column(String(320))  # an e-mail, "anonymous", "cli:USER"
    role: Mapped[str | None] = mapped_column(String(20), nullable=True)
    via: Mapped[str] = mapped_column(String(20))  # local, none, oidc, proxy, cli
    address: Mapped[str | None] = mapped_column(String(64), nullable=True)
    action: Mapped[str] = mapped_column(String(64))  # e.g. silence.create, sign-in
    outcome: Mapped[str] = mapped_column(String(20))  # done, refused, failed
    subject: Mapped[str] = mapped_column(String(200))  # what it acted on, e.g. "silence 7"
    before: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON
    after: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON
    detail: Mapped[str] = mapped_column(Text, default="")  # why refused or failed


class CollectorRow(Base):
    """A running collector (collectors/cluster.py): registered at start, its `last_seen_at`
    beaten every few seconds, removed at a clean shutdown."""

    __tablename__ = "collectors"

    id: Mapped[str] = mapped_column(String(120), primary_key=True)  # host:pid:random
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[float] = mapped_column(Float)
    last_seen_at: Mapped[float] = mapped_column(Float)
    leader_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    targets: Mapped[int | None] = mapped_column(Integer, nullable=True)


class TargetConfigRow(Base):
    """A replica's configuration as its scrapes showed it, one row each time it changed (the
    engine, its generation, model names, the KV cache's block size, blocks, dtype and prefix
    caching): the timeline's config changes and upgrades (kneepoint/timeline.py)."""

    __tablename__ = "target_configs"
    __table_args__ = ({"sqlite_with_rowid": False},)

    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id"), primary_key=True)
    ts: Mapped[float] = mapped_column(Float, primary_key=True)  # its first sample
    config: Mapped[str] = mapped_column(Text)  # JSON, keys sorted


class AnnotationRow(Base):
    """A change posted from outside (a deploy, a prompt version): `kneepoint annotate` or the
    annotation endpoint (kneepoint/annotations.py). `replica` None: the whole fleet."""

    __tablename__ = "annotations"
    __table_args__ = (Index("ix_annotations_ts", "ts"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(Float)
    replica: Mapped[str | None] = mapped_column(String(200), nullable=True)
    text: Mapped[str] = mapped_column(Text)
    author: Mapped[str] = mapped_column(String(320))


class CalibrationRow(Base):
    """A replica's calibrated what-if profile (kneepoint/whatif/store.py): the engine shape,
    the fitted step-cost coefficients and the fit's errors per point, as JSON."""

    __tablename__ = "calibrations"
    __table_args__ = (Index("ix_calibrations_replica", "replica", "fitted_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    replica: Mapped[str] = mapped_column(String(200))
    run_label: Mapped[str | None] = mapped_column(String(200), nullable=True)
    fitted_at: Mapped[float] = mapped_column(Float)
    shape: Mapped[str] = mapped_column(Text)
    coefficients: Mapped[str] = mapped_column(Text)
    errors: Mapped[str] = mapped_column(Text)
    trusted: Mapped[bool] = mapped_column(Boolean)
    notes: Mapped[str] = mapped_column(Text)


class SloSumRow(Base):
    """What SLOs read, summed per target and 5-minute bucket (kneepoint/store/slo_sums.py), as
    Prometheus recording rules keep them: JSON running sums from the first bucket written
    (`sums`), the bucket's own increases (`inner`), and the raw values at its last sample
    (`last`); `sig` says which counters were known and which histogram layouts were read."""

    __tablename__ = "slo_sums"

    target_id: Mapped[int] = mapped_column(Integer, ForeignKey("targets.id"), primary_key=True)
    bucket: Mapped[float] = mapped_column(Float, primary_key=True)  # start, aligned to epoch
    first_ts: Mapped[float] = mapped_column(Float)
    last_ts: Mapped[float] = mapped_column(Float)
    sig: Mapped[str] = mapped_column(Text)
    inner_break: Mapped[bool] = mapped_column(Boolean)
    entry_break: Mapped[bool] = mapped_column(Boolean)
    breaks: Mapped[int] = mapped_column(Integer)  # running count of both
    sums: Mapped[str] = mapped_column(Text)
    inner: Mapped[str] = mapped_column(Text)
    last: Mapped[str] = mapped_column(Text)


class SloSumProgressRow(Base):
    """How far slo_sums reaches: its buckets in [since, until) are written for every target."""

    __tablename__ = "slo_sum_progress"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    since: Mapped[float] = mapped_column(Float)
    until: Mapped[float] = mapped_column(Float)


class PreparedRow(Base):
    """A result computed once by the HA leader and read by every page (kneepoint/store/
    prepared_rows.py): `kind` names what it is (e.g. "slo_reports"), `key` the inputs it was
    computed from besides the store (a fingerprint of the config's parts it reads, so an app
    with another config never reads it), `as_of` the moment it is of, `payload` its JSON.
    Only the newest few per kind are kept."""

    __tablename__ = "prepared"
    __table_args__ = (UniqueConstraint("kind", "key", "as_of", name="uq_prepared_kind_key_as_of"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(64))
    key: Mapped[str] = mapped_column(String(64))
    as_of: Mapped[float] = mapped_column(Float)
    written_at: Mapped[float] = mapped_column(Float)
    payload: Mapped[str] = mapped_column(Text)
