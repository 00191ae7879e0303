"""Celery tasks. Each takes ids (or plain data), calls a service and keeps no result."""

from __future__ import annotations

import logging

from celery import shared_task

from plumbing.redis import redis_client
from scheduler.pools.policies import fair_queue, sync_engines_if_changed
from telemetry.rejections import timeouts_record
from tenants.usage_buffer import usage_flush
from workers.dispatch import dispatch_pool

log = logging.getLogger(__name__)
PING_KEY = "gs:worker-ping:{token}"


@shared_task(name="workers.ping")
def ping(token: str) -> None:
    """Leave a mark in Redis, so a caller can see that a worker runs tasks end to end."""
    redis_client().set(PING_KEY.format(token=token), "pong", ex=60)


@shared_task(name="workers.dispatch")
def dispatch(pool: str) -> None:
    """Start (or nudge) the pool's picker in this process's dispatcher, which runs the pool's
    admissible jobs, fairest first, as many at once as the queue admits."""
    dispatch_pool(pool)


@shared_task(name="workers.flush_usage")
def flush_usage() -> int:
    """Move finished requests from Redis to the usage ledger, in bulk."""
    return usage_flush()


@shared_task(name="workers.housekeeping")
def housekeeping() -> dict[str, int | None]:
    """Every few seconds: engines' policies to the queue, dead leases back to their queues,
    waiting jobs past their class's timeout answered, unused quota leases back from the
    pools of tenants another pool asked for in vain, pools with waiting work kicked (an
    idle loop woken, or one summoned)."""
    queue = fair_queue()
    ready = sync_engines_if_changed(queue)  # None: no engine changed, nothing to copy
    reaped: list[str] = []
    expired: list[str] = []
    for pool in queue.pools():  # a pool's leases and deadlines are in its own slot
        reaped += queue.reap_expired_leases(pool=pool)
        timed_out = queue.expire_waiting(pool=pool)
        timeouts_record(queue, pool, timed_out)  # their waiters are told; the ledger must know
        expired += timed_out
    # Tenants a pool asked for and got too little: their other pools' unused leases come
    # back first, so the kick below finds them grantable.
    rebalanced = queue.rebalance_leases()
    kicked = 0
    for pool in queue.pools_with_waiting_work():
        if queue.kick(pool):  # no loop was idle to wake: a message starts one
            dispatch.delay(pool)
        kicked += 1
    if reaped or expired:
        log.info(
            "housekeeping: %d leases reaped [%s], %d waiting jobs expired [%s]",
            len(reaped), " ".join(reaped), len(expired), " ".join(expired),
        )  # fmt: skip
    return {
        "ready_engines": ready,
        "reaped": len(reaped),
        "expired": len(expired),
        "kicked": kicked,
        "rebalanced": len(rebalanced),
    }
