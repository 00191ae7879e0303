"""GPU readings from NVML: `utilization.gpu` (smoothed; exported only, it reads busy whenever any
kernel runs), GPM SM and tensor activity over a short window (Hopper and later), memory,
temperature and power. Without an NVIDIA driver there are no readings at all, never zeros."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml
import redis
from django.conf import settings

from scheduler.gpu_inventory import (
    GpmActivity,
    NvmlUnavailable,
    gpm_activity,
    nvml_session,
)
from telemetry.live import PREFIX, T, as_float, live_mapping, live_ttl_s, read_hash
from telemetry.smoothing import (
    ewma,
)


def gpu_key(node: str, index: int) -> str:
    return f"{PREFIX}gpu:{node}:{index}"


def gpus_key() -> str:
    """A set of `node:index` of every GPU with live values."""
    return f"{PREFIX}gpus"


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


def gpu_live_write(client: redis.Redis, node: str, reading: GpuReading, now: float) -> float | None:
    """Writes the GPU's live hash; returns its smoothed utilisation (percent)."""
    key = gpu_key(node, reading.index)
    previous = client.hmget(key, ["utilization_smoothed", "at"])
    smoothed: float | None = as_float(previous[0])
    if reading.utilization_percent is not None:
        last_at = as_float(previous[1])
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
    pipe.hset(key, mapping=live_mapping(values))
    pipe.expire(key, live_ttl_s())
    pipe.sadd(gpus_key(), f"{node}:{reading.index}")
    pipe.execute()
    return smoothed


def gpu_live(client: redis.Redis, node: str, index: int) -> dict[str, float]:
    return {name: float(value) for name, value in read_hash(client, gpu_key(node, index)).items()}
