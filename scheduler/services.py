"""Writes about devices and engines. Keyword-only, validated, transactional.

Starting and stopping engine processes lives in scheduler.engines.supervisor; these are the
database writes it and the management commands share.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from audit.services import audit_record, snapshot
from capacity.placement import (
    DedicatedQuotaError,
    EngineDemand,
    PlacementError,
    check_dedicated_quota,
    check_fits_device,
    choose_device,
)
from capacity.units import UNIT_BYTES, device_capacity_units, gib_to_bytes
from plumbing.errors import DomainError
from plumbing.redis import redis_client
from scheduler.adapters.loading import forget_engine
from scheduler.adapters.selectors import tenant_adapter_units
from scheduler.gpu_inventory import GpuInfo
from scheduler.models import (
    DecisionOutcome,
    Device,
    DeviceKind,
    Engine,
    EngineStatus,
    EngineTask,
    Pool,
    ScalingDecision,
)
from scheduler.pools.scaling import Decision, PeakError, parse_peaks
from scheduler.selectors import device_list, device_room, tenant_dedicated_units
from tenants.models import Tenant

# vLLM's --max-lora-rank takes one of these; --max-loras is bounded by the platform.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
MAX_LORAS = 64
# vLLM's VLLM_CPU_KVCACHE_SPACE takes whole GiB, so a CPU engine's footprint does too.
CPU_UNITS_PER_GIB = (1024**3) // UNIT_BYTES


class EngineConflict(DomainError):
    http_status = 409
    code = "engine_conflict"


class NoRoom(DomainError):
    http_status = 409
    code = "no_room"


@transaction.atomic
def device_register_gpus(*, node: str, gpus: list[GpuInfo]) -> list[Device]:
    """Record this node's GPUs (by index); GPUs no longer seen are marked absent, not
    deleted, because engines may still point at them."""
    devices = []
    for gpu in gpus:
        device, _ = Device.objects.update_or_create(
            node=node,
            kind=DeviceKind.GPU,
            index=gpu.index,
            defaults={
                "uuid": gpu.uuid,
                "name": gpu.name,
                "memory_bytes": gpu.memory_bytes,
                "capacity_units": device_capacity_units(gpu.memory_bytes),
                "is_present": True,
            },
        )
        devices.append(device)
    seen = [gpu.index for gpu in gpus]
    Device.objects.filter(node=node, kind=DeviceKind.GPU).exclude(index__in=seen).update(
        is_present=False
    )
    return devices


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU"


@transaction.atomic
def device_register_cpu(*, node: str, kvcache_gib: int) -> Device:
    """The CPU standing in for a GPU: its capacity is the KV space the CPU engine may use."""
    if kvcache_gib < 1:
        raise DomainError("The CPU device needs at least 1 GiB of KV space.")
    memory = gib_to_bytes(kvcache_gib)
    device, _ = Device.objects.update_or_create(
        node=node,
        kind=DeviceKind.CPU,
        index=0,
        defaults={
            "name": _cpu_name(),
            "memory_bytes": memory,
            "capacity_units": device_capacity_units(memory),
            "is_present": True,
        },
    )
    return device


def _check_footprint(*, device: Device, footprint_units: int) -> None:
    if footprint_units < 1:
        raise DomainError("An engine needs at least 1 unit.", param="footprint_units")
    if device.kind == DeviceKind.CPU and footprint_units % CPU_UNITS_PER_GIB:
        raise DomainError(
            f"A CPU engine's KV space is set in whole GiB: use a multiple of "
            f"{CPU_UNITS_PER_GIB} units, not {footprint_units}.",
            param="footprint_units",
        )


def _check_dedicated(*, tenant: Tenant | None, footprint_units: int, engine: Engine | None) -> None:
    if tenant is None:
        return
    try:
        check_dedicated_quota(
            tenant=tenant.slug,
            quota_units=tenant.quota_units,
            dedicated_units_held=tenant_dedicated_units(tenant=tenant, exclude_engine=engine)
            + tenant_adapter_units(tenant=tenant),
            new_units=footprint_units,
        )
    except DedicatedQuotaError as exc:
        raise NoRoom(str(exc), param="dedicated_tenant") from None


def _place(*, name: str, footprint_units: int, device: Device | None) -> Device:
    demand = EngineDemand(name, footprint_units)
    try:
        if device is not None:
            check_fits_device(demand, device_room(device=device, live_only=False))
            return device
        devices = {d.key: d for d in device_list().select_for_update()}
        rooms = [device_room(device=d, live_only=False) for d in devices.values()]
        return devices[choose_device(demand, rooms)]
    except PlacementError as exc:
        raise NoRoom(str(exc), param="device") from None


@transaction.atomic
def engine_create(
    *,
    name: str,
    model_path: str,
    served_model_name: str,
    footprint_units: int,
    port: int,
    device: Device | None = None,
    host: str = "127.0.0.1",
    max_model_len: int = 2048,
    max_num_seqs: int = 32,
    offline_load_threshold: float = 0.4,
    dedicated_tenant: Tenant | None = None,
    task: str = EngineTask.GENERATE,
    max_loras: int = 0,
    max_lora_rank: int = 16,
) -> Engine:
    """Register an engine. Without a device, placement picks one (first fit by units among
    the present devices); either way the device must have room for it beside the engines
    already registered there, and a dedicated engine must fit its tenant's quota. Engines
    that share a served model name form one pool, so they share one task too."""
    if Engine.objects.filter(name=name).exists():
        raise EngineConflict(f"An engine named '{name}' exists already.", param="name")
    if Engine.objects.filter(host=host, port=port).exists():
        raise EngineConflict(f"Another engine already uses {host}:{port}.", param="port")
    if not 0 <= offline_load_threshold <= 1:
        raise DomainError("offline_load_threshold must be within 0..1.")
    if task not in EngineTask.values:
        raise DomainError(f"Unknown task {task!r}; use one of {', '.join(EngineTask.values)}.")
    other = Engine.objects.filter(served_model_name=served_model_name).exclude(task=task).first()
    if other is not None:
        raise EngineConflict(
            f"Engine '{other.name}' serves '{served_model_name}' to {other.task}; an engine "
            f"of the same served model name cannot {task}.",
            param="served_model_name",
        )
    _check_loras(max_loras=max_loras, max_lora_rank=max_lora_rank, task=task)
    if device is not None:
        device = Device.objects.select_for_update().get(pk=device.pk)
    placed = _place(name=name, footprint_units=footprint_units, device=device)
    _check_footprint(device=placed, footprint_units=footprint_units)
    _check_dedicated(tenant=dedicated_tenant, footprint_units=footprint_units, engine=None)
    engine = Engine.objects.create(
        name=name,
        model_path=model_path,
        served_model_name=served_model_name,
        device=placed,
        footprint_units=footprint_units,
        host=host,
        port=port,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        offline_load_threshold=offline_load_threshold,
        dedicated_tenant=dedicated_tenant,
        task=task,
        max_loras=max_loras,
        max_lora_rank=max_lora_rank,
        status=EngineStatus.STOPPED,
    )
    audit_record(action="engine.create", instance=engine, object_id=name, after=snapshot(engine))
    return engine


def _check_loras(*, max_loras: int, max_lora_rank: int, task: str) -> None:
    if max_loras < 0 or max_loras > MAX_LORAS:
        raise DomainError(f"max_loras must be within 0..{MAX_LORAS}.", param="max_loras")
    if max_loras and task != EngineTask.GENERATE:
        raise DomainError("Only an engine that generates serves LoRA adapters.", param="max_loras")
    if max_lora_rank not in LORA_RANKS:
        raise DomainError(
            f"max_lora_rank must be one of {', '.join(map(str, LORA_RANKS))} (vLLM's).",
            param="max_lora_rank",
        )


def engine_set_status(
    *,
    engine: Engine,
    status: EngineStatus,
    detail: str = "",
    pid: int | None = None,
    clear_pid: bool = False,
    kv_capacity_tokens: int | None = None,
    block_size: int | None = None,
    started: bool = False,
) -> Engine:
    """Move an engine to `status`, saying why; only the given fields change."""
    engine.status = status
    engine.status_detail = detail
    fields = ["status", "status_detail", "updated_at"]
    if pid is not None or clear_pid:
        engine.pid = None if clear_pid else pid
        fields.append("pid")
    if kv_capacity_tokens is not None:
        engine.kv_capacity_tokens = kv_capacity_tokens
        fields.append("kv_capacity_tokens")
    if block_size is not None:
        engine.block_size = block_size
        fields.append("block_size")
    if started:
        engine.started_at = timezone.now()
        fields.append("started_at")
    engine.save(update_fields=fields)
    if status != EngineStatus.READY and engine.max_loras:
        # Its process, and the adapters it had loaded, are gone or going.
        forget_engine(redis_client(), engine.name)
    return engine


def engine_check_room_to_start(*, engine: Engine) -> None:
    """Before a process starts: the engines running on the device plus this one must fit
    (an operator may have registered more than fits at once), and a dedicated engine must
    still fit its tenant's quota (quotas can shrink)."""
    room = device_room(device=engine.device, live_only=True)
    if engine.is_live:
        room = type(room)(room.key, room.capacity_units, room.used_units - engine.footprint_units)
    try:
        check_fits_device(EngineDemand(engine.name, engine.footprint_units), room)
    except PlacementError as exc:
        raise NoRoom(str(exc)) from None
    _check_dedicated(
        tenant=engine.dedicated_tenant, footprint_units=engine.footprint_units, engine=engine
    )


# --- Pools and scaling ------------------------------------------------------------------

POOL_PROFILE_FIELDS = (
    "model_path",
    "footprint_units",
    "max_model_len",
    "max_num_seqs",
    "offline_load_threshold",
    "max_loras",
    "max_lora_rank",
)
POOL_POLICY_FIELDS = (
    "enabled",
    "hot_size",
    "cold_max",
    "target_wait_s",
    "target_depth",
    "sustain_s",
    "quiet_period_s",
    "peak_lead_s",
    "peaks",
    "timezone",
)


class PoolConflict(DomainError):
    http_status = 409
    code = "pool_conflict"


def _check_pool(pool: Pool) -> None:
    if pool.hot_size + pool.cold_max < 1:
        raise DomainError("A pool needs at least one engine (hot size + cold maximum >= 1).")
    if not 0 <= pool.offline_load_threshold <= 1:
        raise DomainError("offline_load_threshold must be within 0..1.")
    if pool.target_wait_s <= 0 or pool.target_depth < 1:
        raise DomainError("The scale-up targets must be positive.")
    try:
        parse_peaks(pool.peaks)
    except PeakError as exc:
        raise DomainError(str(exc), param="peaks") from None
    _check_loras(
        max_loras=pool.max_loras, max_lora_rank=pool.max_lora_rank, task=EngineTask.GENERATE
    )
    try:
        ZoneInfo(pool.timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise DomainError(f"Unknown time zone '{pool.timezone}'.", param="timezone") from None


@transaction.atomic
def pool_create(*, served_model_name: str, model_path: str, footprint_units: int,
                **options: Any) -> Pool:  # fmt: skip
    """A pool for a served model. `options`: the policy fields (hot size, cold maximum,
    targets, periods, peaks, time zone) and the rest of the launch profile."""
    if Pool.objects.filter(served_model_name=served_model_name).exists():
        raise PoolConflict(f"A pool for '{served_model_name}' exists already.")
    unknown = set(options) - set(POOL_POLICY_FIELDS) - set(POOL_PROFILE_FIELDS)
    if unknown:
        raise DomainError(f"Unknown pool fields: {', '.join(sorted(unknown))}.")
    pool = Pool(
        served_model_name=served_model_name,
        model_path=model_path,
        footprint_units=footprint_units,
        **options,
    )
    _check_pool(pool)
    pool.save()
    audit_record(action="pool.create", instance=pool, object_id=served_model_name,
                 after=snapshot(pool))  # fmt: skip
    return pool


@transaction.atomic
def pool_update(*, pool: Pool, **fields: Any) -> Pool:
    """Change a pool's policy or launch profile; engines take a new profile at their next
    start (`pool_apply_profile`)."""
    unknown = set(fields) - set(POOL_POLICY_FIELDS) - set(POOL_PROFILE_FIELDS)
    if unknown:
        raise DomainError(f"Unknown pool fields: {', '.join(sorted(unknown))}.")
    before = snapshot(pool)
    for name, value in fields.items():
        setattr(pool, name, value)
    try:
        _check_pool(pool)
    except DomainError:
        pool.refresh_from_db()  # the caller's object shows what is stored, not the refused
        raise
    pool.save()
    audit_record(action="pool.update", instance=pool, object_id=pool.served_model_name,
                 before=before, after=snapshot(pool))  # fmt: skip
    return pool


def pool_add_engines(
    *, pool: Pool, count: int, first_port: int, host: str = "127.0.0.1",
    device: Device | None = None,
) -> list[Engine]:  # fmt: skip
    """Register `count` engines of the pool from its launch profile, on ports from
    `first_port` on, placed by units (or on `device`). They stay stopped: the scaler starts
    them when the pool needs them."""
    if count < 1:
        raise DomainError("Add at least one engine.")
    base = slugify(pool.served_model_name)[:50] or "engine"
    taken = set(Engine.objects.filter(name__startswith=base).values_list("name", flat=True))
    engines: list[Engine] = []
    number, port = 1, first_port
    while len(engines) < count:
        name = f"{base}-{number}"
        number += 1
        if name in taken:
            continue
        while Engine.objects.filter(host=host, port=port).exists():
            port += 1
        engines.append(
            engine_create(
                name=name, model_path=pool.model_path, served_model_name=pool.served_model_name,
                footprint_units=pool.footprint_units, port=port, device=device, host=host,
                max_model_len=pool.max_model_len, max_num_seqs=pool.max_num_seqs,
                offline_load_threshold=pool.offline_load_threshold,
                max_loras=pool.max_loras, max_lora_rank=pool.max_lora_rank,
            )
        )  # fmt: skip
        port += 1
    return engines


def pool_apply_profile(*, pool: Pool, engine: Engine) -> Engine:
    """Before a start: the engine takes the pool's launch profile, so a cold engine starts
    exactly like a hot one. Only a stopped or failed engine changes (a live one keeps what
    it was started with)."""
    if engine.is_live:
        return engine
    changed = [f for f in POOL_PROFILE_FIELDS if getattr(engine, f) != getattr(pool, f)]
    for name in changed:
        setattr(engine, name, getattr(pool, name))
    if changed:
        _check_footprint(device=engine.device, footprint_units=engine.footprint_units)
        engine.save(update_fields=[*changed, "updated_at"])
    return engine


@transaction.atomic
def scaling_decision_record(*, pool: Pool, decision: Decision, at: datetime) -> ScalingDecision:
    """Log a decision with its reason; a start or drain is pending until its node's worker
    has carried it out for every engine it names."""
    acts = decision.changes_something
    return ScalingDecision.objects.create(
        pool=pool,
        at=at,
        action=decision.action,
        code=decision.code,
        reason=decision.reason,
        engines=list(decision.engines),
        outcome=DecisionOutcome.PENDING if acts else DecisionOutcome.NONE,
        remaining=len(decision.engines) if acts else 0,
    )


@transaction.atomic
def scaling_decision_engine_done(
    *, decision_id: int, engine: str, ok: bool, detail: str = ""
) -> ScalingDecision | None:
    """One engine of a pending decision was carried out (or failed): the decision is done
    when all were, failed as soon as one failed; a decision already settled (e.g. expired)
    stays as it is."""
    decision = ScalingDecision.objects.select_for_update().filter(pk=decision_id).first()
    if decision is None or decision.outcome != DecisionOutcome.PENDING:
        return decision
    line = f"{engine}: {'ok' if ok else 'failed'}{': ' + detail if detail else ''}"
    decision.outcome_detail = "\n".join(filter(None, [decision.outcome_detail, line]))
    decision.remaining = max(0, decision.remaining - 1)
    if not ok:
        decision.outcome = DecisionOutcome.FAILED
    elif decision.remaining == 0:
        decision.outcome = DecisionOutcome.DONE
    if decision.outcome != DecisionOutcome.PENDING:
        decision.finished_at = timezone.now()
    decision.save()
    return decision


def scaling_decisions_expire(*, older_than: datetime) -> int:
    """Pending decisions no node carried out in time (its worker is down) fail, so the pool
    is not held forever; their tasks expire at the same time."""
    return ScalingDecision.objects.filter(
        outcome=DecisionOutcome.PENDING, at__lt=older_than
    ).update(
        outcome=DecisionOutcome.FAILED,
        outcome_detail="not carried out in time: is a worker running on the engine's node?",
        finished_at=timezone.now(),
    )
