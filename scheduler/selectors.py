"""Reads about devices and engines.

Engines are a platform resource, not a tenant's: the one read that depends on a tenant
(which engines may serve it) takes the tenant, so a dedicated engine is never offered to
another tenant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from django.db.models import Q, QuerySet, Sum

from capacity.kvcost import kv_bytes_per_token
from capacity.placement import DeviceRoom
from fairqueue.domain import EnginePolicy
from fairqueue.model import offline_gate
from fairqueue.queue import FairQueue
from fairqueue.seats import engine_seats
from plumbing.errors import NotFound
from protocol.classes import RequestClass
from scheduler.models import (
    LIVE_STATUSES,
    Device,
    DeviceKind,
    Engine,
    EngineStatus,
    Pool,
    ScalingDecision,
)
from scheduler.pools.names import engine_pool
from tenants.models import Tenant

_DEVICE_KEY = re.compile(r"^(?:(?P<node>[^/]+)/)?(?P<kind>gpu|cpu)(?P<index>\d+)$")


def device_list(*, node: str | None = None, present_only: bool = True) -> QuerySet[Device]:
    devices = Device.objects.all()
    if node is not None:
        devices = devices.filter(node=node)
    if present_only:
        devices = devices.filter(is_present=True)
    return devices


def device_get(*, key: str, default_node: str) -> Device:
    """A device by its key, `node/gpu0` or just `gpu0` (on `default_node`)."""
    match = _DEVICE_KEY.match(key)
    if match is None:
        raise NotFound(f"'{key}' is not a device key; use node/gpu0, gpu0 or cpu0.")
    node = match["node"] or default_node
    try:
        return Device.objects.get(
            node=node, kind=DeviceKind(match["kind"]), index=int(match["index"])
        )
    except Device.DoesNotExist:
        raise NotFound(
            f"No device {node}/{match['kind']}{match['index']}; run `manage.py gpus discover`."
        ) from None


def device_room(*, device: Device, live_only: bool) -> DeviceRoom:
    """The device as placement sees it. `live_only`: count only engines whose process should
    be running (what memory really holds); otherwise every engine registered on it (the plan)."""
    engines = device.engines.all()
    if live_only:
        engines = engines.filter(status__in=LIVE_STATUSES)
    used = engines.aggregate(total=Sum("footprint_units"))["total"] or 0
    return DeviceRoom(key=device.key, capacity_units=device.capacity_units, used_units=used)


def engine_list(
    *, served_model_name: str | None = None, status: str | None = None
) -> QuerySet[Engine]:
    engines = Engine.objects.select_related("device", "dedicated_tenant")
    if served_model_name is not None:
        engines = engines.filter(served_model_name=served_model_name)
    if status is not None:
        engines = engines.filter(status=status)
    return engines


def engine_get(*, name: str) -> Engine:
    try:
        return Engine.objects.select_related("device", "dedicated_tenant").get(name=name)
    except Engine.DoesNotExist:
        raise NotFound(f"No engine '{name}'.") from None


def engine_ready_for_tenant(*, served_model_name: str, tenant: Tenant) -> QuerySet[Engine]:
    """The ready engines of a model's pool that may serve this tenant: the shared ones and
    the tenant's own dedicated ones. Workers send work to `engine.base_url`."""
    return engine_list(served_model_name=served_model_name, status=EngineStatus.READY).filter(
        Q(dedicated_tenant__isnull=True) | Q(dedicated_tenant=tenant)
    )


@dataclass(frozen=True)
class KvBudget:
    """What the admission check needs about one engine, in bytes (exact integers)."""

    bytes_per_token: int
    block_size: int
    capacity_bytes: int | None  # None until the engine has been started once


def engine_kv_budget(*, engine: Engine) -> KvBudget:
    """The engine's KV cost per token (from its model's config.json), its block size and
    KV capacity (both read back from the running engine). Reservations are
    `kvcost.kv_cost_bytes(bytes_per_token=..., block_size=..., ...)` against `capacity_bytes`."""
    per_token = kv_bytes_per_token(engine.model_path)
    capacity = (
        engine.kv_capacity_tokens * per_token if engine.kv_capacity_tokens is not None else None
    )
    return KvBudget(
        bytes_per_token=per_token, block_size=engine.block_size, capacity_bytes=capacity
    )


def served_model_names(*, ready_only: bool = True) -> list[str]:
    engines = Engine.objects.all()
    if ready_only:
        engines = engines.filter(status=EngineStatus.READY)
    return sorted(set(engines.values_list("served_model_name", flat=True)))


def tenant_dedicated_units(*, tenant: Tenant, exclude_engine: Engine | None = None) -> int:
    """Units the tenant's dedicated engines hold against its quota (registered ones count:
    the engine may be started at any time)."""
    engines = Engine.objects.filter(dedicated_tenant=tenant)
    if exclude_engine is not None:
        engines = engines.exclude(pk=exclude_engine.pk)
    return engines.aggregate(total=Sum("footprint_units"))["total"] or 0


# --- Pools and scaling ------------------------------------------------------------------


def pool_list(*, enabled_only: bool = False) -> QuerySet[Pool]:
    pools = Pool.objects.all()
    return pools.filter(enabled=True) if enabled_only else pools


def pool_get(*, served_model_name: str) -> Pool:
    try:
        return Pool.objects.get(served_model_name=served_model_name)
    except Pool.DoesNotExist:
        raise NotFound(
            f"No pool for '{served_model_name}'; create one with `manage.py pool create`."
        ) from None


def pool_engines(*, pool: Pool) -> QuerySet[Engine]:
    """The pool's engines: the shared engines of its model (a tenant's dedicated engines are
    that tenant's, not the pool's, and the scaler leaves them alone)."""
    return engine_list(served_model_name=pool.served_model_name).filter(
        dedicated_tenant__isnull=True
    )


def scaling_decisions(*, pool: Pool | None = None, limit: int = 50) -> list[ScalingDecision]:
    """The scaler's latest decisions, newest first (of one pool, or of all): what it did
    and why, and how carrying it out went. For the console and `manage.py pool show`."""
    decisions = ScalingDecision.objects.select_related("pool")
    if pool is not None:
        decisions = decisions.filter(pool=pool)
    return list(decisions.order_by("-at", "-pk")[:limit])


@dataclass(frozen=True)
class EngineGate:
    """The offline gate of one engine as the fair queue sees it now (docs/ARCHITECTURE.md,
    The offline gate): `shut_by` is '' while offline work may be picked for it, else
    'online_seats', 'load' or 'seats' (the gate's own reasons, which come first), or 'bound':
    the seat bound of a class above offline is full (`held_back_by` names that class, and
    `bound_*` what the bound is). `load` is None when the engine has no policy in the queue
    (it is not ready, or housekeeping has not synced it yet)."""

    load: float | None
    threshold: float
    load_signal: str = ""
    shut_by: str = ""
    seats: int = 0
    inflight: int = 0
    offline: int = 0
    reserve: int = 0
    held_back_by: str = ""  # the class above whose seat bound holds offline back
    bound_target_s: float | None = None  # that class's TTFT target; None: a fixed bound
    bound_seats: int = 0  # the seats its bound lets the classes below it hold now
    bound_held: int = 0  # the seats those classes hold

    @property
    def is_open(self) -> bool | None:
        return None if self.load is None else self.shut_by == ""

    @property
    def why(self) -> str:
        """What an operator reads: the signal that decides, its value and the threshold."""
        if self.load is None:
            return ""
        online, bar = self.inflight - self.offline, self.threshold
        if self.shut_by == "online_seats":
            return f"online work holds {online} of {self.seats} seats (offline stops at {bar:.0%})"
        signal = (self.load_signal or "load").replace("_", " ")
        if self.shut_by == "load":
            return f"{signal} {self.load:.0%}, at or over {bar:.0%} (or not yet back below)"
        if self.shut_by == "seats":
            return f"every seat taken but the {self.reserve} kept for online work"
        if self.shut_by == "bound":
            above, seats = self.held_back_by, _seats(self.bound_seats)
            what = (
                f"fixed bound of {seats}"
                if self.bound_target_s is None
                else f"TTFT target of {self.bound_target_s * 1000:g} ms"
            )
            return (
                f"{above}'s {what} holds offline back: the classes below {above} hold "
                f"{self.bound_held} of the {seats} it lets them hold now (Seats by class)"
            )
        free = self.seats - self.reserve - self.inflight
        return f"{signal} {self.load:.0%} under {bar:.0%}; {free} seats free for offline work"


def _seats(count: int) -> str:
    return f"{count} seat" if count == 1 else f"{count} seats"


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _texts(fields: dict[Any, Any]) -> dict[str, str]:
    return {str(_text(k)): str(_text(v)) for k, v in fields.items()}


def engine_gate(*, queue: FairQueue, engine: Engine, now: float | None = None) -> EngineGate:
    """Console read: the fair queue's engine policy (the samplers' load), its seats now, and
    the seat bounds of the classes above offline (`fairqueue.seats`), at `now` (Redis's
    clock when not given: the scripts' clock, which decides whether a bound has lapsed)."""
    pipe = queue.redis.pipeline(transaction=False)
    pool = engine_pool(engine)
    pipe.hgetall(queue.keys.engine(pool, engine.name))
    pipe.hgetall(queue.keys.engine_usage(pool, engine.name))
    fields, usage = pipe.execute()
    # Apart: a cluster client takes no keyless command in a pipeline.
    seconds, micros = queue.redis.time()
    policy, use = _texts(fields), _texts(usage)
    threshold = policy.get("offline_load_threshold")
    gate = EngineGate(
        load=float(policy["load"]) if policy.get("load") is not None else None,
        threshold=float(threshold) if threshold is not None else engine.offline_load_threshold,
        load_signal=str(policy.get("load_signal") or ""),
        seats=int(policy.get("max_num_seqs") or 0),
        inflight=int(use.get("inflight") or 0),
        offline=int(use.get("offline") or 0),
        reserve=int(policy.get("offline_reserve") or 0),
    )
    if gate.load is None:
        return gate
    shut_by = offline_gate(
        EnginePolicy(
            engine_id=engine.name,
            pool="",
            kv_budget_bytes=0,
            max_num_seqs=gate.seats,
            offline_load_threshold=gate.threshold,
            load=gate.load,
            offline_gate_margin=float(policy.get("offline_gate_margin") or 0.0),
            offline_reserve=gate.reserve,
        ),
        inflight=gate.inflight,
        offline=gate.offline,
        load_closed=policy.get("load_closed") == "1",
    )
    if shut_by:  # the gate's own reasons come before the seat bounds
        return replace(gate, shut_by=shut_by)
    seats = engine_seats(
        engine.name, policy, use, {}, now if now is not None else seconds + micros / 1e6
    )
    above = seats.limits.get(RequestClass.OFFLINE, "")
    if not above:
        return gate
    bound = next(b for b in seats.bounds if b.request_class == above)
    return replace(
        gate,
        shut_by="bound",
        held_back_by=above,
        bound_target_s=bound.target_s if bound.fixed is None else None,
        bound_seats=bound.bound or 0,
        bound_held=bound.held,
    )
