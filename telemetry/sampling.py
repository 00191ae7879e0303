"""The telemetry tick: GPUs and engines sampled into Redis and history.

Every few seconds (a turn of the workers' ticker, workers/periodic.py, once in the platform):

1. each GPU of this node (`telemetry.gpus`): `utilization.gpu` (smoothed; exported only: busy
   whenever any kernel runs), GPM SM and tensor activity over a short window (Hopper and
   later), memory used/total, temperature, power; without an NVIDIA driver there are no GPU
   readings at all (never zeros);
2. each ready engine's /metrics (`telemetry.engines`): KV-cache usage, running and waiting
   requests, preemptions, TTFT; with its GPU's tensor activity and the fair queue's
   reserved/capacity this is the engine's load (`telemetry.smoothing.engine_load`), written to
   the fair queue for the offline gate (which counts the engine's seats itself, live, at each
   pick);
3. rejections the web views noted (`telemetry.rejections`) resolved to tenants, counted, and
   written to the ledger;
4. new rows of the usage ledger (`telemetry.ledger`) folded into Redis counters (and histogram
   buckets) for `/metrics/cluster`.

Live values are Redis hashes that expire when nobody refreshes them; history rows go to
`telemetry.models` and `telemetry.history` downsamples them as they age.

The worker that claims a turn samples the GPUs of its own node. The engines' crash and health
checks are their node's engine agent's (agent/engines.py): a worker may not see the engines'
processes.
With several GPU nodes, each turn goes to the first ticker that asks for it, so the nodes
share the turns, unevenly: a turn per node (a claim per node) is not done yet. Engines'
/metrics are read over HTTP from any node. A turn that finds the previous one still running
skips it (a Redis lock).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import redis
from django.conf import settings

from fairqueue.queue import FairQueue
from plumbing.redis import redis_client
from scheduler.gpu_inventory import (
    node_name,
)
from scheduler.models import Engine, EngineStatus
from scheduler.pools.policies import fair_queue
from telemetry.engines import EngineReading, engine_live_write, fetch_metrics
from telemetry.gpus import GpuReading, gpu_live_write, read_gpus
from telemetry.ledger import ledger_fold
from telemetry.live import PREFIX
from telemetry.models import EngineSample, GpuSample, Resolution
from telemetry.rejections import rejections_drain

log = logging.getLogger(__name__)
LOCK_KEY = PREFIX + "sample-lock"


# The lock is let go only by the tick that holds it (one round trip): a tick that ran past the
# lock's expiry must not free the next tick's.
_RELEASE_OWN_LOCK = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)


# --- the tick -----------------------------------------------------------------------------


@dataclass
class SampleReport:
    skipped: bool = False
    gpus: list[GpuReading] = field(default_factory=list)
    engines: list[EngineReading] = field(default_factory=list)
    rejections: int = 0
    ledger_rows: int = 0


def telemetry_sample(
    *,
    now: float | None = None,
    queue: FairQueue | None = None,
) -> SampleReport:
    """One sampler tick (see the module's docstring)."""
    client = redis_client()
    interval = float(settings.GPUSHARE_TELEMETRY_INTERVAL_S)
    token = repr(time.time())
    if not client.set(LOCK_KEY, token, nx=True, ex=max(10, int(6 * interval))):
        return SampleReport(skipped=True)
    try:
        return _sample(client, now if now is not None else time.time(), queue)
    finally:
        client.eval(_RELEASE_OWN_LOCK, 1, LOCK_KEY, token)


def _sample(client: redis.Redis, now: float, queue: FairQueue | None) -> SampleReport:
    queue = queue or fair_queue()
    node = node_name(settings.GPUSHARE_NODE_NAME)
    report = SampleReport()
    moment = datetime.fromtimestamp(now, tz=UTC)
    gpu_rows = []
    for reading in read_gpus():
        gpu_live_write(client, node, reading, now)
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
    reserved = queue.engine_reserved_bytes()
    engine_rows = []
    engines = Engine.objects.select_related("device").filter(status=EngineStatus.READY)
    for engine in engines:
        metrics = fetch_metrics(engine)
        engine_reading = engine_live_write(
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
