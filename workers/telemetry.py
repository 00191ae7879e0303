"""Telemetry samplers: GPUs (pynvml) and engines (vLLM /metrics) into Redis and history.

Every few seconds (a turn of the workers' ticker, workers/periodic.py, once in the platform):

1. each GPU of this node: `utilization.gpu` (smoothed; exported only: busy whenever any
   kernel runs), GPM SM and tensor activity over a short window (Hopper and later), memory
   used/total, temperature, power; without an NVIDIA driver there are no GPU readings at
   all (never zeros);
2. the crash/health check of this node's live engines (`engines_check_all`), unless the
   caller leaves it to the node's engine agent (the periodic task does, agent/main.py);
3. each ready engine's /metrics: KV-cache usage, running and waiting requests, preemptions,
   TTFT; with its GPU's tensor activity and the fair queue's reserved/capacity this is the
   engine's load (`workers.smoothing.engine_load`), written to the fair queue for the
   offline gate (which counts the engine's seats itself, live, at each pick);
4. rejections the web views noted (`rejection_note`) resolved to tenants, counted, and
   written to the ledger;
5. new rows of the usage ledger folded into Redis counters (and histogram buckets) for
   `/metrics/cluster`.

Live values are Redis hashes that expire when nobody refreshes them; history rows go to
`workers.models` and `telemetry_rollup` downsamples them as they age.

The worker that claims a turn samples the GPUs (and checks the engines) of its own node.
With several GPU nodes, each turn goes to the first ticker that asks for it, so the nodes
share the turns, unevenly: a turn per node (a claim per node) is not done yet. Engines'
/metrics are read over HTTP from any node. A turn that finds the previous one still running
skips it (a Redis lock).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pynvml
import redis
from django.conf import settings
from django.db import connection, transaction
from redis.typing import EncodableT, FieldT

from config.redis import redis_client
from scheduler.engines.metrics import EngineMetrics
from scheduler.engines.supervisor import engines_check_all, shared_engine_client
from scheduler.fairqueue.queue import FairQueue
from scheduler.gpu_inventory import (
    GpmActivity,
    NvmlUnavailable,
    gpm_activity,
    node_name,
    nvml_session,
)
from scheduler.models import DeviceKind, Engine, EngineStatus
from scheduler.pools import fair_queue
from scheduler.request_classes import REQUEST_CLASSES
from tenants.keys import hash_key
from tenants.models import ApiKey, Outcome, UsageRecord
from tenants.usage_buffer import end_user
from workers.models import EngineSample, GpuSample, Resolution, Sample
from workers.smoothing import Point, counter_increase, downsample, engine_load, ewma, interval_mean

log = logging.getLogger(__name__)

PREFIX = "gs:telemetry:"
LOCK_KEY = PREFIX + "sample-lock"
LEDGER_CURSOR_KEY = PREFIX + "ledger:cursor"
LEDGER_COUNTERS_KEY = PREFIX + "ledger:counters"
LEDGER_HORIZON_KEY = PREFIX + "ledger:horizon"
REJECTIONS_KEY = PREFIX + "rejections"
PENDING_REJECTIONS_KEY = PREFIX + "rejections:pending"
DRAINING_REJECTIONS_KEY = PREFIX + "rejections:draining"
# Prompt tokens the engines counted beyond what was reserved, by tenant (what the KV
# reservation and the quota missed: a hole in the prompt's bound).
UNRESERVED_KEY = PREFIX + "unreserved_prompt_tokens"
# Fields of counter hashes are joined with a tab: slugs, classes and model names hold none.
SEP = "\t"
# Seconds; the admission-wait, time-to-first-token and latency histograms of
# /metrics/cluster. The folded counters name a bucket by its index in these tuples, so a
# tuple is never edited in place: other bounds need a new counter kind (the old counts would
# land in the wrong buckets). TTFT is counted from arrival, so its buckets reach into
# queueing times too.
WAIT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 300.0)
LATENCY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# Ledger rows folded per tick at most: a long backlog catches up over several ticks.
FOLD_PAGE = 5000

T = TypeVar("T")


def gpu_key(node: str, index: int) -> str:
    return f"{PREFIX}gpu:{node}:{index}"


def gpus_key() -> str:
    """A set of `node:index` of every GPU with live values."""
    return f"{PREFIX}gpus"


def engine_key(name: str) -> str:
    return f"{PREFIX}engine:{name}"


# The lock is let go only by the tick that holds it (one round trip): a tick that ran past the
# lock's expiry must not free the next tick's.
_RELEASE_OWN_LOCK = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)


def _live_ttl_s() -> int:
    return int(3 * float(settings.GPUSHARE_TELEMETRY_INTERVAL_S) + 30)


# --- GPUs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuReading:
    """One GPU now. None where the GPU did not answer that query."""

    index: int
    utilization_percent: float | None
    memory_used_bytes: float | None
    memory_total_bytes: float | None
    temperature_c: float | None
    power_w: float | None
    sm_activity: float | None = None
    tensor_activity: float | None = None


# GPM's window: the sampler thread sleeps this long once per tick, for all GPUs together.
GPM_WINDOW_S = 0.2


def _ask(query: Callable[[], T]) -> T | None:
    try:
        return query()
    except pynvml.NVMLError:
        return None


def _read_gpu(index: int, handle: Any, activity: GpmActivity | None) -> GpuReading:
    if handle is None:
        return GpuReading(index, None, None, None, None, None)
    utilization = _ask(lambda: pynvml.nvmlDeviceGetUtilizationRates(handle))
    memory = _ask(lambda: pynvml.nvmlDeviceGetMemoryInfo(handle))
    temperature = _ask(lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))
    milliwatts = _ask(lambda: pynvml.nvmlDeviceGetPowerUsage(handle))
    return GpuReading(
        index=index,
        utilization_percent=float(utilization.gpu) if utilization is not None else None,
        memory_used_bytes=float(memory.used) if memory is not None else None,
        memory_total_bytes=float(memory.total) if memory is not None else None,
        temperature_c=float(temperature) if temperature is not None else None,
        power_w=milliwatts / 1000.0 if milliwatts is not None else None,
        sm_activity=activity.sm_activity if activity is not None else None,
        tensor_activity=activity.tensor_activity if activity is not None else None,
    )


def _handle(index: int) -> Any:
    return _ask(lambda: pynvml.nvmlDeviceGetHandleByIndex(index))


def read_gpus() -> list[GpuReading]:
    """Every GPU of this node now; empty without an NVIDIA driver. Never raises."""
    try:
        with nvml_session():
            count = pynvml.nvmlDeviceGetCount()
            handles = [_handle(index) for index in range(count)]
            known = [handle for handle in handles if handle is not None]
            activity = iter(gpm_activity(known, GPM_WINDOW_S))
            return [
                _read_gpu(index, handle, next(activity) if handle is not None else None)
                for index, handle in enumerate(handles)
            ]
    except (NvmlUnavailable, pynvml.NVMLError):
        return []


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _hash(client: redis.Redis, key: str) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in client.hgetall(key).items()}


def _float(value: bytes | str | None) -> float | None:
    if value is None or value in ("", b""):
        return None
    return float(value)


def _live_mapping(values: Mapping[str, float | None]) -> dict[FieldT, EncodableT]:
    """Only the values we have: an absent field stays absent in Redis too."""
    return {name: repr(float(v)) for name, v in values.items() if v is not None}


def _gpu_live(client: redis.Redis, node: str, reading: GpuReading, now: float) -> float | None:
    """Writes the GPU's live hash; returns its smoothed utilisation (percent)."""
    key = gpu_key(node, reading.index)
    previous = client.hmget(key, ["utilization_smoothed", "at"])
    smoothed: float | None = _float(previous[0])
    if reading.utilization_percent is not None:
        last_at = _float(previous[1])
        elapsed = now - last_at if last_at is not None else 0.0
        smoothed = ewma(
            smoothed,
            reading.utilization_percent,
            elapsed,
            float(settings.GPUSHARE_TELEMETRY_SMOOTHING_S),
        )
    values = {
        "utilization_percent": reading.utilization_percent,
        "utilization_smoothed": smoothed,
        "memory_used_bytes": reading.memory_used_bytes,
        "memory_total_bytes": reading.memory_total_bytes,
        "temperature_c": reading.temperature_c,
        "power_w": reading.power_w,
        "sm_activity": reading.sm_activity,
        "tensor_activity": reading.tensor_activity,
        "at": now,
    }
    pipe = client.pipeline()
    pipe.delete(key)  # a field that stopped answering must not linger
    pipe.hset(key, mapping=_live_mapping(values))
    pipe.expire(key, _live_ttl_s())
    pipe.sadd(gpus_key(), f"{node}:{reading.index}")
    pipe.execute()
    return smoothed


def gpu_live(client: redis.Redis, node: str, index: int) -> dict[str, float]:
    return {name: float(value) for name, value in _hash(client, gpu_key(node, index)).items()}


# --- engines ------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineReading:
    engine: str
    model: str
    load: float
    gpu_utilization: float | None
    kv_cache_usage: float | None
    reserved_fraction: float | None
    requests_running: float | None
    requests_waiting: float | None
    preemptions: float | None
    ttft_mean_s: float | None
    load_signal: str = ""
    seat_occupancy: float | None = None  # the engine's running sequences / its seats
    sm_activity: float | None = None
    tensor_activity: float | None = None


def _engine_gpu(client: redis.Redis, engine: Engine) -> dict[str, float | None]:
    """The engine's GPU as its node's sampler left it: smoothed utilisation, SM and tensor
    activity, 0..1; all None on a CPU device, each None when the GPU has no such reading."""
    names = ("utilization_smoothed", "sm_activity", "tensor_activity")
    if engine.device.kind != DeviceKind.GPU:
        return dict.fromkeys(names)
    values = client.hmget(gpu_key(engine.device.node, engine.device.index), list(names))
    gpu = {name: _float(value) for name, value in zip(names, values, strict=True)}
    smoothed = gpu["utilization_smoothed"]
    gpu["utilization_smoothed"] = smoothed / 100.0 if smoothed is not None else None
    return gpu


def _reserved_fraction(queue: FairQueue, engine: str, reserved_bytes: int) -> float | None:
    budget = int(queue.redis.hget(queue.keys.engine(engine), "kv_budget_bytes") or 0)
    return reserved_bytes / budget if budget > 0 else None


def _fetch_metrics(engine: Engine) -> EngineMetrics | None:
    try:
        return shared_engine_client(engine).metrics()
    except Exception as exc:  # a slow or restarting engine: its other signals still count
        log.info("telemetry: no /metrics from engine %s: %s", engine.name, exc)
        return None


def _engine_live(
    client: redis.Redis,
    queue: FairQueue,
    engine: Engine,
    metrics: EngineMetrics | None,
    reserved_bytes: int,
    now: float,
) -> EngineReading:
    key = engine_key(engine.name)
    previous = _hash(client, key)
    gpu = _engine_gpu(client, engine)
    gpu_utilization = gpu["utilization_smoothed"]
    reserved_fraction = _reserved_fraction(queue, engine.name, reserved_bytes)
    kv_usage = metrics.kv_cache_usage if metrics is not None else None
    preemptions = ttft_mean = None
    state: dict[str, float | None] = {}
    if metrics is not None:
        if metrics.preemptions_total is not None:
            preemptions = counter_increase(
                _float(previous.get("preemptions_total")), metrics.preemptions_total
            )
        if metrics.ttft_seconds_sum is not None and metrics.ttft_seconds_count is not None:
            ttft_mean = interval_mean(
                _float(previous.get("ttft_sum")),
                _float(previous.get("ttft_count")),
                metrics.ttft_seconds_sum,
                metrics.ttft_seconds_count,
            )
        state = {
            "preemptions_total": metrics.preemptions_total,
            "ttft_sum": metrics.ttft_seconds_sum,
            "ttft_count": metrics.ttft_seconds_count,
        }
    load = engine_load(
        kv_cache_usage=kv_usage,
        reserved_fraction=reserved_fraction,
        tensor_activity=gpu["tensor_activity"],
    )
    running = metrics.requests_running if metrics is not None else None
    reading = EngineReading(
        engine=engine.name,
        model=engine.served_model_name,
        load=load.value,
        load_signal=load.signal,
        seat_occupancy=(
            running / engine.max_num_seqs if running is not None and engine.max_num_seqs else None
        ),
        sm_activity=gpu["sm_activity"],
        tensor_activity=gpu["tensor_activity"],
        gpu_utilization=gpu_utilization,
        kv_cache_usage=kv_usage,
        reserved_fraction=reserved_fraction,
        requests_running=metrics.requests_running if metrics is not None else None,
        requests_waiting=metrics.requests_waiting if metrics is not None else None,
        preemptions=preemptions,
        ttft_mean_s=ttft_mean,
    )
    values: dict[str, float | None] = {
        "load": load.value,
        "seat_occupancy": reading.seat_occupancy,
        "sm_activity": reading.sm_activity,
        "tensor_activity": reading.tensor_activity,
        "gpu_utilization": gpu_utilization,
        "kv_cache_usage": kv_usage,
        "reserved_fraction": reserved_fraction,
        "requests_running": reading.requests_running,
        "requests_waiting": reading.requests_waiting,
        **state,
        "at": now,
    }
    # The last interval that saw a first token keeps its mean until a newer one does.
    values["ttft_mean_s"] = (
        ttft_mean if ttft_mean is not None else _float(previous.get("ttft_mean_s"))
    )
    pipe = client.pipeline()
    pipe.delete(key)
    mapping = _live_mapping(values)
    mapping["model"] = engine.served_model_name
    mapping["load_signal"] = load.signal
    pipe.hset(key, mapping=mapping)
    pipe.expire(key, _live_ttl_s())
    pipe.execute()
    queue.set_engine_load(engine.name, load.value, load.signal)
    return reading


def engine_live(client: redis.Redis, name: str) -> dict[str, str]:
    return _hash(client, engine_key(name))


# --- the tick -----------------------------------------------------------------------------


@dataclass
class SampleReport:
    skipped: bool = False
    gpus: list[GpuReading] = field(default_factory=list)
    engines: list[EngineReading] = field(default_factory=list)
    failed_engines: list[str] = field(default_factory=list)
    rejections: int = 0
    ledger_rows: int = 0


def telemetry_sample(
    *,
    now: float | None = None,
    queue: FairQueue | None = None,
    check_engines: bool = True,
) -> SampleReport:
    """One sampler tick (see the module's docstring)."""
    client = redis_client()
    interval = float(settings.GPUSHARE_TELEMETRY_INTERVAL_S)
    token = repr(time.time())
    if not client.set(LOCK_KEY, token, nx=True, ex=max(10, int(6 * interval))):
        return SampleReport(skipped=True)
    try:
        return _sample(client, now if now is not None else time.time(), queue, check_engines)
    finally:
        client.eval(_RELEASE_OWN_LOCK, 1, LOCK_KEY, token)


def _sample(
    client: redis.Redis, now: float, queue: FairQueue | None, check_engines: bool
) -> SampleReport:
    queue = queue or fair_queue()
    node = node_name(settings.GPUSHARE_NODE_NAME)
    report = SampleReport()
    moment = datetime.fromtimestamp(now, tz=UTC)
    gpu_rows = []
    for reading in read_gpus():
        _gpu_live(client, node, reading, now)
        report.gpus.append(reading)
        gpu_rows.append(
            GpuSample(
                node=node,
                gpu_index=reading.index,
                resolution=Resolution.RAW,
                at=moment,
                utilization_percent=reading.utilization_percent,
                memory_used_bytes=reading.memory_used_bytes,
                memory_total_bytes=reading.memory_total_bytes,
                temperature_c=reading.temperature_c,
                power_w=reading.power_w,
            )
        )
    if check_engines:
        try:
            report.failed_engines = [e.name for e in engines_check_all()]
        except Exception:  # one broken engine record must not stop the sampling
            log.exception("telemetry: the engine check failed")
    reserved = queue.engine_reserved_bytes()
    engine_rows = []
    engines = Engine.objects.select_related("device").filter(status=EngineStatus.READY)
    for engine in engines:
        metrics = _fetch_metrics(engine)
        engine_reading = _engine_live(
            client, queue, engine, metrics, reserved.get(engine.name, 0), now
        )
        report.engines.append(engine_reading)
        engine_rows.append(
            EngineSample(
                engine=engine_reading.engine,
                model=engine_reading.model,
                resolution=Resolution.RAW,
                at=moment,
                **{name: getattr(engine_reading, name) for name in EngineSample.VALUE_FIELDS},
            )
        )
    GpuSample.objects.bulk_create(gpu_rows)
    EngineSample.objects.bulk_create(engine_rows)
    report.rejections = rejections_drain(client)
    report.ledger_rows = ledger_fold(client)
    return report


# --- the ledger, folded into counters for /metrics/cluster -------------------------------


def _bucket_index(value_s: float, buckets: tuple[float, ...]) -> str:
    for index, bound in enumerate(buckets):
        if value_s <= bound:
            return str(index)
    return "inf"


def counter_field(*parts: object) -> str:
    return SEP.join(str(p) for p in parts)


def _fold_increments(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    increments: dict[str, float] = {}

    def add(name: str, amount: float) -> None:
        increments[name] = increments.get(name, 0.0) + amount

    for row in rows:
        labels = (row["tenant__slug"], row["request_class"], row["model"])
        add(counter_field("req", *labels, row["outcome"]), row["requests"])
        add(counter_field("tok", *labels, "prompt"), row["prompt_tokens"])
        add(counter_field("tok", *labels, "completion"), row["completion_tokens"])
        if row["outcome"] in (Outcome.REJECTED, Outcome.TIMEOUT):
            continue  # never admitted: no admission wait, no run
        wait_s, latency_s = row["queue_wait_ms"] / 1000.0, row["latency_ms"] / 1000.0
        add(counter_field("wait", *labels, _bucket_index(wait_s, WAIT_BUCKETS_S)), 1)
        add(counter_field("wait_sum", *labels), wait_s)
        add(counter_field("lat", *labels, _bucket_index(latency_s, LATENCY_BUCKETS_S)), 1)
        add(counter_field("lat_sum", *labels), latency_s)
        if row["ttft_ms"] is not None:  # None: no token came (an error before the first)
            ttft_s = row["ttft_ms"] / 1000.0
            add(counter_field("ttft", *labels, _bucket_index(ttft_s, TTFT_BUCKETS_S)), 1)
            add(counter_field("ttft_sum", *labels), ttft_s)
    return increments


def ledger_fold(client: redis.Redis | None = None, *, page: int = FOLD_PAGE) -> int:
    """Adds ledger rows newer than the cursor to the counters; returns how many.

    Ids are handed out when a row is inserted but seen when its transaction commits, so a
    bulk write still in flight can hold ids below one already visible. A fold therefore
    reads only up to the newest id the *previous* fold saw (a tick ago): a row is counted
    one tick late rather than skipped. Callers hold the sampler's lock, so two folds never
    count a row twice: the counters and the cursor move together in one transaction.
    """
    client = client or redis_client()
    cursor, horizon = (int(v or 0) for v in client.mget(LEDGER_CURSOR_KEY, LEDGER_HORIZON_KEY))
    newest = _newest_ledger_id()
    rows = (
        []
        if horizon <= cursor
        else list(  # nothing new below the horizon: no query
            UsageRecord.objects.filter(pk__gt=cursor, pk__lte=horizon)
            .order_by("pk")
            .values(
                "pk",
                "tenant__slug",
                "request_class",
                "model",
                "outcome",
                "prompt_tokens",
                "completion_tokens",
                "queue_wait_ms",
                "ttft_ms",
                "latency_ms",
                "requests",
            )[:page]
        )
    )
    pipe = client.pipeline(transaction=True)
    for name, amount in _fold_increments(rows).items():
        pipe.hincrbyfloat(LEDGER_COUNTERS_KEY, name, amount)
    if rows:
        pipe.set(LEDGER_CURSOR_KEY, rows[-1]["pk"])
    if len(rows) < page:  # caught up to the horizon: the next fold may go as far as now
        pipe.set(LEDGER_HORIZON_KEY, newest)
    pipe.execute()
    return len(rows)


def _newest_ledger_id() -> int:
    """The ledger's highest id. In SQL of its own: the ORM's aggregate cost more CPU to
    compile than the database took to answer it, every tick."""
    meta, quote = UsageRecord._meta, connection.ops.quote_name
    with connection.cursor() as cursor:
        # The model's own table and column: nothing from outside goes into this SQL.
        cursor.execute(f"SELECT MAX({quote(meta.pk.column)}) FROM {quote(meta.db_table)}")
        row = cursor.fetchone()
    return int(row[0] or 0) if row else 0


def ledger_counters(client: redis.Redis | None = None) -> dict[tuple[str, ...], float]:
    raw = _hash(client or redis_client(), LEDGER_COUNTERS_KEY)
    return {tuple(name.split(SEP)): float(value) for name, value in raw.items()}


# --- rejections: refused before a job exists ---------------------------------------------


REJECTION_FIELDS = 6  # key hash, reason, status, class, endpoint, second


def rejection_note(
    *,
    authorization: str,
    reason: str,
    status: int,
    request_class: str,
    endpoint: str,
    at: float,
    client: redis.Redis | None = None,
) -> None:
    """Notes one refused request: a single HINCRBY, cheap enough for the web view.

    The key is kept as its hash (as the database keeps it); the sampler resolves it to a
    tenant, counts it for /metrics/cluster and writes `rejected` rows to the ledger. A 401's
    key is not anyone's, so it is not even hashed.
    """
    parts = authorization.split()
    key_hash = hash_key(parts[1]) if len(parts) == 2 and status != 401 else ""
    # The class comes from a client's header: only a known one is kept (a tab in it would
    # add a field to the name), and the ledger gives the key's default class otherwise.
    request_class = request_class if request_class in REQUEST_CLASSES else ""
    name = counter_field(key_hash, reason, status, request_class, endpoint, int(at))
    (client or redis_client()).hincrby(PENDING_REJECTIONS_KEY, name, 1)


def rejections_drain(client: redis.Redis | None = None) -> int:
    """The rejections noted since the last drain: counted by tenant, reason and status for
    /metrics/cluster, and written to the ledger (outcome `rejected`, or `timeout` for a queue
    timeout) when the key was a tenant's. Returns how many were drained."""
    client = client or redis_client()
    # One round trip on a tick with nothing noted, nearly every tick: a drain cut short
    # is finished first, else what is pending becomes the drain.
    pipe = client.pipeline(transaction=False)
    pipe.exists(DRAINING_REJECTIONS_KEY)
    pipe.exists(PENDING_REJECTIONS_KEY)
    draining, pending = pipe.execute()
    if not draining:
        if not pending:
            return 0
        try:
            client.rename(PENDING_REJECTIONS_KEY, DRAINING_REJECTIONS_KEY)
        except redis.ResponseError:  # nothing pending any more
            return 0
    noted: list[tuple[list[str], int]] = []
    for field_name, value in _hash(client, DRAINING_REJECTIONS_KEY).items():
        fields = field_name.split(SEP)
        if len(fields) != REJECTION_FIELDS:  # never raise on it: every later drain would
            log.warning("dropping a malformed rejection note: %r", field_name[:200])
            continue
        noted.append((fields, int(value)))
    hashes = {parts[0] for parts, _ in noted if parts[0]}
    keys = {
        k.hashed_key: k
        for k in ApiKey.objects.select_related("tenant").filter(hashed_key__in=hashes)
    }
    counts: dict[str, int] = {}
    records: list[UsageRecord] = []
    for (key_hash, reason, status, request_class, endpoint, at), count in noted:
        api_key = keys.get(key_hash)
        tenant = api_key.tenant.slug if api_key is not None else ""
        name = counter_field(tenant, reason, status)
        counts[name] = counts.get(name, 0) + count
        if api_key is None:
            continue
        outcome = Outcome.TIMEOUT if reason == "queue_timeout" else Outcome.REJECTED
        records.append(
            UsageRecord(
                request_id=f"rej-{uuid.uuid4().hex}",
                tenant=api_key.tenant,
                api_key=api_key,
                model="",
                request_class=(
                    request_class if request_class in REQUEST_CLASSES else api_key.default_class
                ),
                endpoint=endpoint,
                outcome=outcome,
                status_code=int(status),
                error_code=reason,
                finished_at=datetime.fromtimestamp(int(at), tz=UTC),
                requests=count,  # the refusals of one key, reason and second: one row
            )
        )
    UsageRecord.objects.bulk_create(records, batch_size=1000)
    pipe = client.pipeline(transaction=True)
    for name, count in counts.items():
        pipe.hincrby(REJECTIONS_KEY, name, count)
    pipe.delete(DRAINING_REJECTIONS_KEY)
    pipe.execute()
    return sum(count for _, count in noted)


def unreserved_prompt_tokens(client: redis.Redis | None = None) -> dict[str, int]:
    """Tenant -> prompt tokens its runs used beyond what they reserved, so far."""
    return {tenant: int(v) for tenant, v in _hash(client or redis_client(), UNRESERVED_KEY).items()}


def rejection_counts(client: redis.Redis | None = None) -> dict[tuple[str, str, str], int]:
    """(tenant, reason, status) -> rejections so far; tenant '' when the key was nobody's."""
    raw = _hash(client or redis_client(), REJECTIONS_KEY)
    counts: dict[tuple[str, str, str], int] = {}
    for name, value in raw.items():
        tenant, reason, status = name.split(SEP)
        counts[(tenant, reason, status)] = int(value)
    return counts


def timeouts_record(queue: FairQueue, job_ids: Iterable[str], *, now: float | None = None) -> int:
    """Jobs the fair queue expired (they waited past their class's queue timeout, see
    `FairQueue.expire_waiting`) written to the ledger as `timeout` rows, 503 `queue_timeout`,
    with the wait they had. Idempotent: the row's request id is the job id. Returns how many
    were written. Housekeeping, which expires them, is the caller."""
    moment = now if now is not None else time.time()
    records = []
    for job_id in job_ids:
        job = queue.get_job(job_id)
        if job is None or not job.payload:
            continue
        request = json.loads(job.payload)
        received = float(request.get("received_at") or job.enqueued_at)
        waited_ms = int(max(0.0, moment - received) * 1000)
        records.append(
            UsageRecord(
                request_id=job_id,
                tenant_id=request["tenant_id"],
                api_key_id=request.get("api_key_id"),
                model=request.get("model", ""),
                request_class=job.request_class,
                batch_id=request.get("batch_id", ""),
                endpoint=request.get("endpoint", ""),
                end_user=end_user(request.get("body", {})),
                outcome=Outcome.TIMEOUT,
                status_code=503,
                error_code="queue_timeout",
                queue_wait_ms=waited_ms,
                latency_ms=waited_ms,
                finished_at=datetime.fromtimestamp(moment, tz=UTC),
            )
        )
    UsageRecord.objects.bulk_create(records, ignore_conflicts=True)
    return len(records)


# --- history: downsampling and retention --------------------------------------------------


@dataclass(frozen=True)
class RollupReport:
    to_minute: int = 0
    to_hour: int = 0
    dropped: int = 0


_BUCKET_S: dict[str, int] = {Resolution.MINUTE: 60, Resolution.HOUR: 3600}


S = TypeVar("S", bound=Sample)


def _fold(
    model: type[S],
    source: str,
    target: str,
    cutoff: datetime,
) -> int:
    """Rows of `source` resolution before `cutoff` become `target` buckets (the cutoff is
    bucket-aligned, so every bucket folded is complete). A target bucket that exists
    already (a late sample) is folded again with the newcomers, weighted by samples."""
    size = _BUCKET_S[target]
    series_fields, value_fields = model.SERIES_FIELDS, model.VALUE_FIELDS
    with transaction.atomic():
        rows = list(model._default_manager.filter(resolution=source, at__lt=cutoff).order_by("at"))
        if not rows:
            return 0
        first = datetime.fromtimestamp(int(rows[0].at.timestamp()) // size * size, tz=UTC)
        existing = list(
            model._default_manager.filter(resolution=target, at__gte=first, at__lt=cutoff)
        )
        by_series: dict[tuple[Any, ...], list[Point]] = {}
        for row in [*existing, *rows]:
            series = tuple(getattr(row, f) for f in series_fields)
            by_series.setdefault(series, []).append(
                Point(
                    at=row.at.timestamp(),
                    values={f: getattr(row, f) for f in value_fields},
                    samples=row.samples,
                )
            )
        folded: list[S] = []
        for series, points in by_series.items():
            for bucket in downsample(points, size):
                folded.append(
                    model(
                        **dict(zip(series_fields, series, strict=True)),
                        resolution=target,
                        at=datetime.fromtimestamp(bucket.at, tz=UTC),
                        samples=bucket.samples,
                        **{f: bucket.values.get(f) for f in value_fields},
                    )
                )
        model._default_manager.filter(pk__in=[r.pk for r in existing]).delete()
        model._default_manager.filter(pk__in=[r.pk for r in rows]).delete()
        model._default_manager.bulk_create(folded)
    return len(rows)


def _aligned(moment: datetime, size_s: int) -> datetime:
    return datetime.fromtimestamp(int(moment.timestamp()) // size_s * size_s, tz=UTC)


def telemetry_rollup(*, now: datetime | None = None) -> RollupReport:
    """Raw samples older than the raw window become per-minute means, per-minute older than
    the minute window become per-hour means, anything older than the retention is dropped."""
    now = now or datetime.now(tz=UTC)
    raw_cutoff = _aligned(now - timedelta(days=settings.GPUSHARE_TELEMETRY_RAW_DAYS), 60)
    minute_cutoff = _aligned(now - timedelta(days=settings.GPUSHARE_TELEMETRY_MINUTE_DAYS), 3600)
    retention_cutoff = now - timedelta(days=settings.GPUSHARE_TELEMETRY_RETENTION_DAYS)
    to_minute = to_hour = dropped = 0
    models: tuple[type[Sample], ...] = (GpuSample, EngineSample)
    for model in models:
        to_minute += _fold(model, Resolution.RAW, Resolution.MINUTE, raw_cutoff)
        to_hour += _fold(model, Resolution.MINUTE, Resolution.HOUR, minute_cutoff)
        dropped += model._default_manager.filter(at__lt=retention_cutoff).delete()[0]
    return RollupReport(to_minute=to_minute, to_hour=to_hour, dropped=dropped)
