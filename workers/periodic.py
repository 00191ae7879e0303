"""The periodic jobs that run every few seconds, carried by one beat message: the tick.

Each Celery message costs the sender, the worker and Redis several ms of CPU whatever the
task does (kombu's bookkeeping of delivery, acknowledgement and routing; measured in
docs/BENCHMARKS.md), more than the ledger flush or the housekeeping it carries. So beat sends
one `workers.tick` at the shortest interval, and the tick runs each job whose own interval
has come round. A job's turn is claimed in Redis (SET NX with an expiry just under its
interval), so a tick that comes twice, or two beats, still run each job once per interval.
One job that fails is logged and does not keep the others from running.

The jobs stay Celery tasks of their own as well (`workers.housekeeping` and so on), for an
operator who wants to run one now.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from celery import shared_task
from django.conf import settings

from config.redis import redis_client

log = logging.getLogger(__name__)

CLAIM_KEY = "gpushare:tick:{name}"


@dataclass(frozen=True)
class PeriodicJob:
    name: str
    every_s: float
    run: Callable[[], Any]


def periodic_jobs() -> list[PeriodicJob]:
    """The jobs the tick carries, with their intervals from settings."""
    from workers.batch_tasks import batch_tick  # the task modules import this app's models
    from workers.scaling_tasks import scaler_tick
    from workers.tasks import flush_usage, housekeeping
    from workers.telemetry_tasks import sample

    return [
        PeriodicJob("flush_usage", settings.GPUSHARE_USAGE_FLUSH_INTERVAL_S, flush_usage),
        PeriodicJob("housekeeping", settings.GPUSHARE_HOUSEKEEPING_INTERVAL_S, housekeeping),
        PeriodicJob("batch_tick", settings.GPUSHARE_BATCH_FEED_INTERVAL_S, batch_tick),
        PeriodicJob("telemetry_sample", settings.GPUSHARE_TELEMETRY_INTERVAL_S, sample),
        PeriodicJob("scaler_tick", settings.GPUSHARE_SCALER_INTERVAL_S, scaler_tick),
    ]


def claim_due(client: redis.Redis, jobs: Sequence[PeriodicJob], tick_s: float) -> list[str]:
    """Claims the turn of each job whose interval has come round (one round trip); returns
    their names. A claim lasts half a tick less than the job's interval, so that the tick
    after the interval finds it gone even when it comes a little early."""
    pipe = client.pipeline(transaction=False)
    for job in jobs:
        hold_ms = max(1, int((job.every_s - tick_s / 2) * 1000))
        pipe.set(CLAIM_KEY.format(name=job.name), "1", nx=True, px=hold_ms)
    return [job.name for job, claimed in zip(jobs, pipe.execute(), strict=True) if claimed]


def run_due(client: redis.Redis, jobs: Sequence[PeriodicJob], tick_s: float) -> dict[str, Any]:
    """Runs the jobs whose turn this tick claimed; returns each one's result (or error)."""
    due = set(claim_due(client, jobs, tick_s))
    results: dict[str, Any] = {}
    for job in jobs:
        if job.name not in due:
            continue
        try:
            results[job.name] = job.run()
        except Exception as exc:  # one failing job must not keep the others from running
            log.exception("periodic job %s failed", job.name)
            results[job.name] = f"error: {type(exc).__name__}: {exc}"
    return results


@shared_task(name="workers.tick")
def tick() -> dict[str, Any]:
    """Beat, every `GPUSHARE_TICK_INTERVAL_S`: the periodic jobs that are due."""
    return run_due(redis_client(), periodic_jobs(), float(settings.GPUSHARE_TICK_INTERVAL_S))
