"""The arithmetic of telemetry: smoothing, an engine's load, counters, downsampling. Pure.

No Django and no Redis here, so unit tests can run every rule without services.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


def ewma(previous: float | None, value: float, elapsed_s: float, tau_s: float) -> float:
    """Exponentially weighted moving average with a time constant, not a fixed alpha:
    samples that arrive late or early weigh by the time they stand for.

    After `tau_s` seconds of a constant new value, the average has moved 63% of the way.
    """
    if previous is None or tau_s <= 0:
        return value
    alpha = 1.0 - math.exp(-max(0.0, elapsed_s) / tau_s)
    return previous + alpha * (value - previous)


@dataclass(frozen=True)
class Load:
    """An engine's load, 0..1, and the signal it came from ('' when there was none)."""

    value: float
    signal: str


def engine_load(
    *,
    kv_cache_usage: float | None,
    reserved_fraction: float | None,
    tensor_activity: float | None,
) -> Load:
    """The load the offline gate reads: the largest of the engine's own KV-cache usage, the
    platform's reserved/capacity and its GPU's tensor activity (NVML GPM), all 0..1, each
    a measure of room the engine has left. A missing signal (a CPU engine, a GPU without
    GPM, an engine that did not answer) is left out, not counted as idle or busy.

    NVML's `utilization.gpu` is not a signal: it is the share of time any kernel ran, 100 %
    with one sequence decoding, so it would hold the gate shut on a nearly idle GPU; it is
    exported, never gated on. Seats are counted live by the fair queue at each pick
    (`lua/lib.lua` offline_gate), not here a sampling interval late."""
    signals = {
        "kv_cache_usage": kv_cache_usage,
        "reserved_fraction": reserved_fraction,
        "tensor_activity": tensor_activity,
    }
    known = {name: value for name, value in signals.items() if value is not None}
    if not known:
        return Load(0.0, "")
    signal = max(known, key=lambda name: known[name])
    return Load(min(1.0, max(0.0, known[signal])), signal)


def counter_increase(previous: float | None, current: float) -> float:
    """How much a monotonic counter grew since the previous reading; a counter that went
    down was reset (its process restarted), so all of its current value is new."""
    if previous is None:
        return 0.0
    if current < previous:
        return current
    return current - previous


def interval_mean(
    previous_sum: float | None,
    previous_count: float | None,
    current_sum: float,
    current_count: float,
) -> float | None:
    """The mean of a Prometheus histogram's observations made between two readings
    (from the growth of its `_sum` and `_count`); None when nothing was observed."""
    if previous_sum is None or previous_count is None or current_count < previous_count:
        return None  # no baseline yet, or the engine restarted
    observed = current_count - previous_count
    if observed <= 0:
        return None
    return (current_sum - previous_sum) / observed


def bucket_start(timestamp: float, size_s: int) -> float:
    return math.floor(timestamp / size_s) * size_s


@dataclass(frozen=True)
class Point:
    """One sample (or an already averaged bucket of `samples` samples) of some fields."""

    at: float
    values: Mapping[str, float | None]
    samples: int = 1


def downsample(points: Iterable[Point], size_s: int) -> list[Point]:
    """Points folded into buckets of `size_s` seconds (start-aligned): each field is the
    mean of the samples that had it, weighted by how many samples each point stands for.
    A field no sample of a bucket had stays None: absence is kept, never turned into 0."""
    sums: dict[float, dict[str, float]] = {}
    weights: dict[float, dict[str, int]] = {}
    counts: dict[float, int] = {}
    fields: dict[float, set[str]] = {}
    for point in points:
        start = bucket_start(point.at, size_s)
        counts[start] = counts.get(start, 0) + point.samples
        bucket_sums = sums.setdefault(start, {})
        bucket_weights = weights.setdefault(start, {})
        bucket_fields = fields.setdefault(start, set())
        for name, value in point.values.items():
            bucket_fields.add(name)
            if value is None:
                continue
            bucket_sums[name] = bucket_sums.get(name, 0.0) + value * point.samples
            bucket_weights[name] = bucket_weights.get(name, 0) + point.samples
    result = []
    for start in sorted(counts):
        values: dict[str, float | None] = {}
        for name in sorted(fields[start]):
            weight = weights[start].get(name, 0)
            values[name] = sums[start][name] / weight if weight else None
        result.append(Point(at=start, values=values, samples=counts[start]))
    return result
