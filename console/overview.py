"""The overview: each device as a grid of its 256 MiB units, the engines on it, and the fair
queue's depth by class."""

from __future__ import annotations

from dataclasses import dataclass

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.safestring import mark_safe

from console.charts import UnitBlock, unit_grid
from console.live import LIVE_REFRESH_S, EngineRow, class_totals, engine_rows
from plumbing.redis import redis_client
from scheduler.models import (
    Device,
    DeviceKind,
)
from scheduler.pools.policies import fair_queue
from scheduler.selectors import (
    device_list,
    engine_list,
)
from staff.access import console_permission
from staff.roles import Perm
from telemetry.gpus import gpu_live


@dataclass(frozen=True)
class DeviceView:
    device: Device
    grid: str
    live_units: int
    engines: list[EngineRow]
    # The GPU sampler's live readings (utilisation %, memory bytes, °C); empty for a CPU or
    # a GPU whose node's sampler has not reported lately.
    readings: dict[str, float]


def _device_views(rows: list[EngineRow]) -> list[DeviceView]:
    by_device: dict[int, list[EngineRow]] = {}
    for row in rows:
        by_device.setdefault(row.engine.device_id, []).append(row)
    views = []
    devices = list(device_list(present_only=False))
    for device in devices:
        on_it = by_device.get(device.pk, [])
        if not device.is_present and not on_it:
            continue
        live = [r for r in on_it if r.engine.is_live]
        blocks = [
            UnitBlock(
                key=r.engine.name,
                label=r.engine.name,
                units=r.engine.footprint_units,
                colour=r.colour,
                detail=f"{r.engine.status}, "
                + (
                    f"dedicated to {r.engine.dedicated_tenant.slug}"
                    if r.engine.dedicated_tenant
                    else f"shared, {r.engine.served_model_name}"
                ),
            )
            for r in live
        ]
        grid = unit_grid(
            blocks,
            capacity_units=device.capacity_units,
            title=f"{device.key}: {device.capacity_units} units of 256 MiB",
        )
        views.append(
            DeviceView(
                device=device,
                grid=mark_safe(grid),
                live_units=sum(b.units for b in blocks),
                engines=on_it,
                readings=gpu_live(redis_client(), device.node, device.index)
                if device.kind == DeviceKind.GPU
                else {},
            )
        )
    return views


def _overview_context() -> dict[str, object]:
    snapshot = fair_queue().snapshot()
    rows = engine_rows(list(engine_list()), snapshot)
    return {
        "section": "overview",
        "devices": _device_views(rows),
        "engines": rows,
        "classes": class_totals(snapshot),
        "refreshed_at": timezone.now(),
        "refresh_s": LIVE_REFRESH_S,
    }


@console_permission(Perm.VIEW)
def overview(request: HttpRequest) -> HttpResponse:
    return render(request, "console/overview.html", _overview_context())


@console_permission(Perm.VIEW)
def overview_live(request: HttpRequest) -> HttpResponse:
    """The overview's live part, which the page swaps in every few seconds."""
    return render(request, "console/_overview_live.html", _overview_context())
