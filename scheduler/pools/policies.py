"""Where the database meets the fair queue: pools, policies and routing.

Django holds the truth (tenants' quotas and weights, engines and their state); the fair queue
in Redis holds the copy its Lua scripts decide with. The copy is written here: a tenant's
policy at each of its requests (cheap, and it survives a Redis restart), engines' policies
when they become ready and by a periodic sync that also removes engines no longer ready.

A pool is the set of engines serving one model to the same tenants: the shared engines of a
served model, or one tenant's dedicated engines of it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TypeVar

from django.conf import settings

from capacity.kvcost import kv_bytes_per_token
from capacity.units import units_to_bytes
from fairqueue.domain import (
    EnginePolicy,
    JobRejected,
    TenantPolicy,
    config_from_settings,
)
from fairqueue.queue import FairQueue
from plumbing.change_marks import ChangeMark
from plumbing.redis import redis_client
from scheduler.adapters.loading import forget_engine
from scheduler.adapters.selectors import engine_adapter_slot_units, tenant_adapter_units
from scheduler.models import Engine, EngineStatus
from scheduler.pools.names import engine_pool
from scheduler.reservation.modes import pool_reservation
from scheduler.seats.bounds import controller_settings, pool_bounds
from scheduler.selectors import engine_ready_for_tenant, tenant_dedicated_units
from tenants.models import Tenant

log = logging.getLogger(__name__)

T = TypeVar("T")


@cache
def _fair_queue_for(url: str) -> FairQueue:
    return FairQueue(redis_client(), config_from_settings(settings))


def fair_queue() -> FairQueue:
    """The process's fair queue client (scripts registered once)."""
    return _fair_queue_for(settings.REDIS_URL)


@cache
def model_kv_bytes_per_token(model_path: str) -> int:
    return kv_bytes_per_token(model_path)


def engine_kv_budget_bytes(engine: Engine) -> int:
    """What the engine's picks may reserve: its KV capacity less its adapter slots, so that
    the adapters it may load never take KV a reservation counts on
    (docs/decisions/0015-lora-adapters-per-tenant.md)."""
    kv = (engine.kv_capacity_tokens or 0) * model_kv_bytes_per_token(engine.model_path)
    return max(0, kv - units_to_bytes(engine_adapter_slot_units(engine)))


def sync_tenant(tenant: Tenant, queue: FairQueue | None = None) -> None:
    """The tenant's policy for KV reservations: its quota less what its dedicated engines
    and its adapters hold (a dedicated engine's whole footprint, and every registered
    adapter's units, count against the quota)."""
    held = tenant_dedicated_units(tenant=tenant) + tenant_adapter_units(tenant=tenant)
    kv_units = max(0, tenant.quota_units - held)
    (queue or fair_queue()).set_tenant_policy(
        tenant.slug,
        TenantPolicy(
            weight=tenant.weight,
            quota_bytes=units_to_bytes(kv_units),
            burst_bytes=units_to_bytes(tenant.burst_units),
        ),
    )


def sync_engine(engine: Engine, queue: FairQueue | None = None) -> None:
    """Ready engines take picks; any other engine takes none (in-flight work still ends)."""
    queue = queue or fair_queue()
    if engine.status != EngineStatus.READY or not engine.kv_capacity_tokens:
        queue.remove_engine(engine.name)
        if engine.max_loras:
            forget_engine(queue.redis, engine.name)  # what it had loaded is gone with it
        return
    pool = engine_pool(engine)
    load = queue.redis.hget(queue.keys.engine(pool, engine.name), "load")
    bounds = pool_bounds(pool)
    reservation = pool_reservation(pool)
    queue.set_engine_policy(
        EnginePolicy(
            engine_id=engine.name,
            pool=pool,
            kv_budget_bytes=engine_kv_budget_bytes(engine),
            max_num_seqs=engine.max_num_seqs,
            offline_load_threshold=engine.offline_load_threshold,
            load=float(load) if load is not None else 0.0,  # the samplers own the load
            queued=engine_queue(engine.max_num_seqs),
            offline_gate_margin=float(settings.GPUSHARE_OFFLINE_GATE_MARGIN),
            offline_reserve=offline_reserve(engine.max_num_seqs),
            ttft_targets_s=bounds.ttft_targets_s,
            fixed_seats_below=bounds.fixed_seats_below,
            seat_controller=controller_settings(),
            reservation=reservation.mode,
            output_quantile=reservation.output_quantile,
        )
    )


def offline_reserve(max_num_seqs: int) -> int:
    """The seats offline work leaves free for online work arriving (see EnginePolicy): never
    all of them, so that offline work still runs on an idle engine of one seat."""
    share = min(1.0, max(0.0, float(settings.GPUSHARE_OFFLINE_RESERVE_PER_SEAT)))
    return min(math.ceil(max_num_seqs * share), max(0, max_num_seqs - 1))


def engine_queue(max_num_seqs: int) -> int:
    """How many requests beyond its seats an engine holds waiting (see EnginePolicy)."""
    return math.ceil(max_num_seqs * max(0.0, float(settings.GPUSHARE_ENGINE_QUEUED_PER_SEAT)))


def enqueue_resyncing(
    enqueue: Callable[[], T], *, engine: Engine, tenant: Tenant, queue: FairQueue
) -> T:
    """Runs `enqueue`; when the queue has not heard of the engine or the tenant (the engine
    became ready since the last sync; Redis lost its data, even between a caller's own sync
    and this call), tells it both and tries once more. (The web's event loop does the same
    with the queue's asyncio client: `scheduler.online.admission`.)"""
    try:
        return enqueue()
    except JobRejected as exc:
        if not resync_helps(exc):
            raise
    resync(engine, tenant, queue)
    return enqueue()


def resync_helps(exc: JobRejected) -> bool:
    """Whether the queue refused a job for want of its engine's or its tenant's policy."""
    return exc.reason in ("no_engine", "unknown_tenant")


def resync(engine: Engine, tenant: Tenant, queue: FairQueue) -> None:
    """Tells the queue the engine's and the tenant's policies, read afresh from the database.
    The caller's row may be cached (the web's routes): read again, a row read before the
    engine drained or failed does not bring it back into the picks."""
    fresh = Engine.objects.select_related("dedicated_tenant").filter(pk=engine.pk).first()
    if fresh is not None:
        sync_engine(fresh, queue)
    sync_tenant(tenant, queue)


def engine_changes() -> ChangeMark:
    """Counts saves of engines' rows (scheduler.signals), for `sync_engines_if_changed` and
    the per-process caches of engines' rows (`cache_by_marks`)."""
    return ChangeMark("engines", recheck_s=settings.GPUSHARE_CHANGE_RECHECK_S)


def sync_engines_if_changed(queue: FairQueue | None = None) -> int | None:
    """`sync_all_engines` when an engine's row changed since the last sync, or the recheck
    is due; None when nothing changed. The sync is a safety net: an engine that becomes ready
    or leaves is synced at once by whoever changes it, and a request that finds the queue
    without its engine syncs it (`enqueue_resyncing`)."""
    return engine_changes().run_if_moved(lambda: sync_all_engines(queue))


def sync_all_engines(queue: FairQueue | None = None) -> int:
    queue = queue or fair_queue()
    known = {str(e) for e in queue.redis.smembers(queue.keys.engines())}
    engines = list(Engine.objects.select_related("dedicated_tenant"))
    for engine in engines:
        sync_engine(engine, queue)
    for gone in known - {e.name for e in engines}:
        queue.remove_engine(gone)
    return sum(1 for e in engines if e.status == EngineStatus.READY)


@dataclass(frozen=True)
class Route:
    """Where a tenant's request for a model goes: its pool and a ready engine to ask about
    the prompt (tokenize) and the model's limits."""

    pool: str
    engine: Engine
    kv_bytes_per_token: int


def route_for(*, tenant: Tenant, served_model_name: str) -> Route | None:
    """The tenant's dedicated pool of the model if one of its engines is ready, else the
    shared pool; None when no engine of the model is ready for it."""
    ready = list(engine_ready_for_tenant(served_model_name=served_model_name, tenant=tenant))
    if not ready:
        return None
    dedicated = [e for e in ready if e.dedicated_tenant_id == tenant.pk]
    engine = (dedicated or ready)[0]
    return Route(engine_pool(engine), engine, model_kv_bytes_per_token(engine.model_path))


def sync_pool_engines(pool: str, queue: FairQueue | None = None) -> int:
    """Copies the policies of the pool's engines to the fair queue now (its seat bounds
    changed); returns how many engines the pool has."""
    queue = queue or fair_queue()
    engines = [
        e for e in Engine.objects.select_related("dedicated_tenant") if engine_pool(e) == pool
    ]
    for engine in engines:
        sync_engine(engine, queue)
    return len(engines)
