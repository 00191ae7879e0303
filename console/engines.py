"""The engines pages: the list, one engine (its live numbers, log, placement preview and the
progress of a start or stop) and the actions start, drain and stop, carried out on the
engine's node (`scheduler.worker_tasks`)."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_POST

from audit.services import audit_record
from capacity.placement import DeviceRoom, EngineDemand, plan_placement
from console.charts import UnitBlock, unit_grid
from console.live import MOVING_STATUSES, engine_rows, is_htmx
from plumbing.errors import NotFound
from plumbing.redis import redis_client
from scheduler import worker_tasks
from scheduler.adapters.loading import loaded_on
from scheduler.engines.process import log_tail
from scheduler.engines.progress import action_pending, progress_begin, progress_lines
from scheduler.engines.supervisor import engine_log_path
from scheduler.models import (
    Engine,
    EngineStatus,
)
from scheduler.pools.policies import fair_queue, sync_engine
from scheduler.selectors import (
    device_list,
    device_room,
    engine_get,
    engine_list,
)
from scheduler.services import NoRoom, engine_check_room_to_start, engine_set_status
from staff.access import console_permission
from staff.roles import Perm


def _engine_or_404(name: str) -> Engine:
    try:
        return engine_get(name=name)
    except NotFound as exc:
        raise Http404(str(exc)) from None


@console_permission(Perm.VIEW)
def engine_list_page(request: HttpRequest) -> HttpResponse:
    snapshot = fair_queue().snapshot()
    rows = engine_rows(list(engine_list()), snapshot)
    moving = any(r.engine.status in MOVING_STATUSES for r in rows)
    context = {"section": "engines", "engines": rows, "moving": moving}
    template = "console/engines/_table.html" if is_htmx(request) else "console/engines/list.html"
    return render(request, template, context)


@dataclass(frozen=True)
class Preview:
    """Where an engine would run if started now, or why it cannot."""

    fits: bool
    message: str
    room: DeviceRoom
    elsewhere: str = ""  # another device that has room, when its own has not


def _placement_preview(engine: Engine) -> Preview:
    room = device_room(device=engine.device, live_only=True)
    if engine.is_live:
        return Preview(True, f"running on {engine.device.key}", room)
    try:
        engine_check_room_to_start(engine=engine)
    except NoRoom as exc:
        others = [
            device_room(device=d, live_only=True) for d in device_list() if d.pk != engine.device_id
        ]
        plan = plan_placement([EngineDemand(engine.name, engine.footprint_units)], others)
        where = plan.assignments.get(engine.name, "")
        return Preview(False, str(exc), room, elsewhere=where)
    after = room.free_units - engine.footprint_units
    return Preview(
        True,
        f"fits on {engine.device.key}: it takes {engine.footprint_units} of the "
        f"{room.free_units} free units there, leaving {after} of {room.capacity_units}",
        room,
    )


def _engine_context(engine: Engine) -> dict[str, object]:
    snapshot = fair_queue().snapshot()
    row = engine_rows([engine], snapshot)[0]
    preview = _placement_preview(engine)
    others = [r for r in engine_rows(list(engine_list()), snapshot) if r.engine.is_live]
    blocks = [
        UnitBlock(r.engine.name, r.engine.name, r.engine.footprint_units, r.colour)
        for r in others
        if r.engine.device_id == engine.device_id and r.engine.pk != engine.pk
    ]
    if not engine.is_live:
        # The preview: this engine drawn where it would go, after what runs there now.
        blocks.append(
            UnitBlock(
                engine.name,
                f"{engine.name} (if started)",
                engine.footprint_units,
                "#f0a202",
            )
        )
    else:
        blocks.insert(0, UnitBlock(engine.name, engine.name, engine.footprint_units, row.colour))
    grid = unit_grid(
        blocks,
        capacity_units=engine.device.capacity_units,
        title=f"{engine.device.key} with {engine.name}",
    )
    return {
        "section": "engines",
        "row": row,
        "engine": engine,
        "preview": preview,
        "preview_grid": mark_safe(grid),
        "progress": progress_lines(engine.name),
        "log_tail": log_tail(engine_log_path(engine), lines=20),
        "log_path": engine_log_path(engine),
        "moving": engine.status in MOVING_STATUSES or action_pending(engine.name),
        # Least recently used first: the next to be unloaded when the engine is full.
        "adapters_loaded": loaded_on(redis_client(), engine.name) if engine.max_loras else [],
    }


@console_permission(Perm.VIEW)
def engine_detail(request: HttpRequest, name: str) -> HttpResponse:
    engine = _engine_or_404(name)
    template = (
        "console/engines/_progress.html" if is_htmx(request) else "console/engines/detail.html"
    )
    return render(request, template, _engine_context(engine))


@console_permission(Perm.OPERATE_ENGINES)
@require_POST
def engine_action(request: HttpRequest, name: str, action: str) -> HttpResponseRedirect:
    """start / drain / stop. Start and stop run in a Celery task (they take minutes); the
    engine's page polls its status and the task's progress lines."""
    engine = _engine_or_404(name)
    if action == "start":
        if engine.is_live:
            messages.error(request, f"{engine.name} is {engine.status} already.")
            return redirect("console:engine", name=engine.name)
        try:
            engine_check_room_to_start(engine=engine)
        except NoRoom as exc:
            messages.error(request, f"{engine.name} cannot start: {exc}")
            return redirect("console:engine", name=engine.name)
        progress_begin(engine.name, "start requested from the console")
        worker_tasks.engine_start(engine.name, engine.device.node)
        messages.success(request, f"Starting {engine.name}; this page follows its progress.")
    elif action == "drain":
        if engine.status != EngineStatus.READY:
            messages.error(
                request, f"Only a ready engine can drain; {engine.name} is {engine.status}."
            )
            return redirect("console:engine", name=engine.name)
        engine_set_status(
            engine=engine, status=EngineStatus.DRAINING, detail="draining (from the console)"
        )
        sync_engine(engine)  # out of the fair queue now: no new picks, in-flight work ends
        progress_begin(
            engine.name, "draining: no new work; stop it once nothing is in flight", pending=False
        )
        messages.success(request, f"{engine.name} is draining: it takes no new work.")
    elif action == "stop":
        if not engine.is_live and engine.status != EngineStatus.FAILED:
            messages.error(request, f"{engine.name} is {engine.status}; nothing to stop.")
            return redirect("console:engine", name=engine.name)
        progress_begin(engine.name, "stop requested from the console")
        worker_tasks.engine_stop(engine.name, engine.device.node)
        messages.success(request, f"Stopping {engine.name} (a ready engine drains first).")
    else:
        raise Http404(f"No engine action '{action}'.")
    audit_record(action=f"engine.{action}", instance=engine, object_id=engine.name,
                 after={"status": engine.status})  # fmt: skip
    return redirect("console:engine", name=engine.name)
