"""Writes about devices and engines. Keyword-only, validated, transactional.

Starting and stopping engine processes lives in scheduler.engines.supervisor; these are the
database writes it and the management commands share.
"""

from __future__ import annotations

from pathlib import Path

from django.db import transaction
from django.utils import timezone

from config.errors import DomainError
from scheduler.gpu_inventory import GpuInfo
from scheduler.models import Device, DeviceKind, Engine, EngineStatus
from scheduler.placement import (
    DedicatedQuotaError,
    EngineDemand,
    PlacementError,
    check_dedicated_quota,
    check_fits_device,
    choose_device,
)
from scheduler.selectors import device_list, device_room, tenant_dedicated_units
from scheduler.units import UNIT_BYTES, device_capacity_units, gib_to_bytes
from tenants.models import Tenant

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
            dedicated_units_held=tenant_dedicated_units(tenant=tenant, exclude_engine=engine),
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
) -> Engine:
    """Register an engine. Without a device, placement picks one (first fit by units among
    the present devices); either way the device must have room for it beside the engines
    already registered there, and a dedicated engine must fit its tenant's quota."""
    if Engine.objects.filter(name=name).exists():
        raise EngineConflict(f"An engine named '{name}' exists already.", param="name")
    if Engine.objects.filter(host=host, port=port).exists():
        raise EngineConflict(f"Another engine already uses {host}:{port}.", param="port")
    if not 0 <= offline_load_threshold <= 1:
        raise DomainError("offline_load_threshold must be within 0..1.")
    if device is not None:
        device = Device.objects.select_for_update().get(pk=device.pk)
    placed = _place(name=name, footprint_units=footprint_units, device=device)
    _check_footprint(device=placed, footprint_units=footprint_units)
    _check_dedicated(tenant=dedicated_tenant, footprint_units=footprint_units, engine=None)
    return Engine.objects.create(
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
        status=EngineStatus.STOPPED,
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
