"""The periodic jobs that run every few seconds, run by each worker's ticker thread.

The ledger flush, housekeeping, the batch feeder, the telemetry sampler and the scaler run
every 1 to 10 s, the budget check every minute. A Celery message costs the sender, the worker
and Redis several ms of CPU whatever the task does (kombu's bookkeeping of delivery,
acknowledgement and routing): more than the flush or the housekeeping, and more than a
request's own handling (docs/decisions/0007-periodic-work-on-each-workers-ticker.md). So
each worker process runs them from a ticker thread of its own (`Ticker`), at the shortest of
their intervals, each job in a thread of a small pool so that a slow one holds back only
itself, and no message crosses the broker.

A job's turn is claimed in Redis (SET NX with an expiry just under its interval), so the
tickers of many workers, or a tick that comes twice, still run each job once per interval
in the whole platform; a worker that dies leaves the jobs to the others' tickers. One job
that fails is logged and does not keep the others from running. Beat sends only the rare
ones (the telemetry rollup, every few minutes), and each job is also a Celery task of its own
(`workers.housekeeping` and so on), for an operator who wants to run one now.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import redis
from celery.signals import worker_ready, worker_shutting_down
from django.conf import settings
from django.db import connection

from plumbing.redis import redis_client

log = logging.getLogger(__name__)

CLAIM_KEY = "gs:tick:{name}"


@dataclass(frozen=True)
class PeriodicJob:
    name: str
    every_s: float
    run: Callable[[], Any]


def periodic_jobs() -> list[PeriodicJob]:
    """The jobs the ticker runs, with their intervals from settings."""
    from workers.batch_tasks import batch_tick  # the task modules import this app's models
    from workers.billing_tasks import budgets_check
    from workers.scaling_tasks import scaler_tick
    from workers.tasks import flush_usage, housekeeping
    from workers.telemetry_tasks import sample

    return [
        PeriodicJob("flush_usage", settings.GPUSHARE_USAGE_FLUSH_INTERVAL_S, flush_usage),
        PeriodicJob("housekeeping", settings.GPUSHARE_HOUSEKEEPING_INTERVAL_S, housekeeping),
        PeriodicJob("batch_tick", settings.GPUSHARE_BATCH_FEED_INTERVAL_S, batch_tick),
        PeriodicJob("telemetry_sample", settings.GPUSHARE_TELEMETRY_INTERVAL_S, sample),
        PeriodicJob("scaler_tick", settings.GPUSHARE_SCALER_INTERVAL_S, scaler_tick),
        PeriodicJob("budgets_check", settings.GPUSHARE_BUDGET_CHECK_INTERVAL_S, budgets_check),
    ]


def tick_interval_s(jobs: Sequence[PeriodicJob]) -> float:
    """The ticker's interval: the shortest of its jobs'."""
    return min(job.every_s for job in jobs)


def claim_due(client: redis.Redis, jobs: Sequence[PeriodicJob], tick_s: float) -> list[str]:
    """Claims the turn of each job whose interval has come round (one round trip); returns
    their names. A claim lasts half a tick less than the job's interval, so that the tick
    after the interval finds it gone even when it comes a little early."""
    pipe = client.pipeline(transaction=False)
    for job in jobs:
        hold_ms = max(1, int((job.every_s - tick_s / 2) * 1000))
        pipe.set(CLAIM_KEY.format(name=job.name), "1", nx=True, px=hold_ms)
    return [job.name for job, claimed in zip(jobs, pipe.execute(), strict=True) if claimed]


class Ticker:
    """A daemon thread that claims the due periodic jobs every `tick_s` until stopped, and
    runs each claimed job in a thread of a small pool: a slow job (the sampler waiting on a
    saturated engine's /metrics, a write waiting on SQLite's lock) delays only its own next
    run, not the other jobs' (the scaler and housekeeping keep their cadence). A job still
    running is not claimed again by this ticker."""

    def __init__(
        self,
        jobs: Callable[[], Sequence[PeriodicJob]],
        tick_s: float,
        client: Callable[[], redis.Redis] = redis_client,
    ) -> None:
        self._jobs, self.tick_s, self._client = jobs, tick_s, client
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._runners = ThreadPoolExecutor(max_workers=8, thread_name_prefix="periodic-job")
        self._running: set[str] = set()
        self._next_ask: dict[str, float] = {}  # job name -> when to claim it next (monotonic)
        self._lock = threading.Lock()

    def start(self) -> None:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="periodic-ticker", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 0.0) -> None:
        self._stopping.set()
        if self._thread is not None and timeout_s > 0:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        due_at = time.monotonic()
        while not self._stopping.wait(max(0.0, due_at - time.monotonic())):
            due_at = max(due_at + self.tick_s, time.monotonic())
            try:
                self._tick()
            except Exception:  # Redis away: the next tick tries again
                log.warning("periodic tick failed", exc_info=True)

    def _tick(self, now: float | None = None) -> None:
        """Claims the jobs whose interval came round here since this ticker last asked for
        them (not every job at every tick: most would be refused, each a SET for nothing);
        a job another ticker claimed meanwhile is asked for again an interval later."""
        now = time.monotonic() if now is None else now
        with self._lock:
            asking = [
                job
                for job in self._jobs()
                if job.name not in self._running and now >= self._next_ask.get(job.name, now)
            ]
        if not asking:
            return
        claimed = set(claim_due(self._client(), asking, self.tick_s))
        for job in asking:
            # Half a tick early, as the claims expire: the tick an interval on still asks.
            self._next_ask[job.name] = now + job.every_s - self.tick_s / 2
            if job.name in claimed:
                with self._lock:
                    self._running.add(job.name)
                self._runners.submit(self._run_job, job)

    def _run_job(self, job: PeriodicJob) -> None:
        try:
            job.run()
        except Exception:  # logged; the job runs again at its next turn
            log.exception("periodic job %s failed", job.name)
        finally:
            with self._lock:
                self._running.discard(job.name)
            try:
                # The thread lives as long as the worker: hand its database connection back
                # to the pool between runs rather than hold one for good.
                connection.close()
            except Exception:
                log.warning("could not hand back the database connection", exc_info=True)


_ticker: Ticker | None = None


@worker_ready.connect
def _start_ticker(**_: Any) -> None:
    global _ticker
    if not settings.GPUSHARE_WORKER_TICK:
        return
    _ticker = Ticker(periodic_jobs, tick_interval_s(periodic_jobs()))
    _ticker.start()
    log.info("periodic ticker started: every %.1f s", _ticker.tick_s)


@worker_shutting_down.connect
def _stop_ticker(**_: Any) -> None:
    if _ticker is not None:
        _ticker.stop()
