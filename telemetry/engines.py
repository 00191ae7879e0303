"""Engine readings from each ready engine's /metrics: KV-cache usage, running and waiting
requests, preemptions, TTFT. With its GPU's tensor activity and the fair queue's reserved
fraction this is the engine's load (`telemetry.smoothing.engine_load`), which the offline gate
reads."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis

from fairqueue.queue import FairQueue
from scheduler.engines.metrics import EngineMetrics
from scheduler.engines.supervisor import shared_engine_client
from scheduler.models import DeviceKind, Engine
from scheduler.pools.names import engine_pool
from telemetry.gpus import gpu_key
from telemetry.live import PREFIX, as_float, live_mapping, live_ttl_s, read_hash
from telemetry.smoothing import (
    counter_increase,
    engine_load,
    interval_mean,
)

log = logging.getLogger(__name__)


def engine_key(name: str) -> str:
    return f"{PREFIX}engine:{name}"


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
    gpu = {name: as_float(value) for name, value in zip(names, values, strict=True)}
    smoothed = gpu["utilization_smoothed"]
    gpu["utilization_smoothed"] = smoothed / 100.0 if smoothed is not None else None
    return gpu


def _reserved_fraction(queue: FairQueue, engine: Engine, reserved_bytes: int) -> float | None:
    key = queue.keys.engine(engine_pool(engine), engine.name)
    budget = int(queue.redis.hget(key, "kv_budget_bytes") or 0)
    return reserved_bytes / budget if budget > 0 else None


def fetch_metrics(engine: Engine) -> EngineMetrics | None:
    try:
        return shared_engine_client(engine).metrics()
    except Exception as exc:  # a slow or restarting engine: its other signals still count
        log.info("telemetry: no /metrics from engine %s: %s", engine.name, exc)
        return None


def engine_live_write(
    client: redis.Redis,
    queue: FairQueue,
    engine: Engine,
    metrics: EngineMetrics | None,
    reserved_bytes: int,
    now: float,
) -> EngineReading:
    key = engine_key(engine.name)
    previous = read_hash(client, key)
    gpu = _engine_gpu(client, engine)
    gpu_utilization = gpu["utilization_smoothed"]
    reserved_fraction = _reserved_fraction(queue, engine, reserved_bytes)
    kv_usage = metrics.kv_cache_usage if metrics is not None else None
    preemptions = ttft_mean = None
    state: dict[str, float | None] = {}
    if metrics is not None:
        if metrics.preemptions_total is not None:
            preemptions = counter_increase(
                as_float(previous.get("preemptions_total")), metrics.preemptions_total
            )
        if metrics.ttft_seconds_sum is not None and metrics.ttft_seconds_count is not None:
            ttft_mean = interval_mean(
                as_float(previous.get("ttft_sum")),
                as_float(previous.get("ttft_count")),
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
        ttft_mean if ttft_mean is not None else as_float(previous.get("ttft_mean_s"))
    )
    pipe = client.pipeline()
    pipe.delete(key)
    mapping = live_mapping(values)
    mapping["model"] = engine.served_model_name
    mapping["load_signal"] = load.signal
    pipe.hset(key, mapping=mapping)
    pipe.expire(key, live_ttl_s())
    pipe.execute()
    queue.set_engine_load(
        engine_pool(engine),
        engine.name,
        load.value,
        load.signal,
        kv_usage=kv_usage,
        preempted=preemptions,
    )
    return reading


def engine_live(client: redis.Redis, name: str) -> dict[str, str]:
    return read_hash(client, engine_key(name))
