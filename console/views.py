"""Console pages of the scheduler app: the overview (devices as unit grids, engines, queue
depth), engines (start/drain/stop with progress, placement preview), queues (the fair
queue's snapshot and the offline gate), batches, and the capacity planner.

Thin: the database through scheduler.selectors, live values through the telemetry samplers'
readers (telemetry.sampling) and the fair queue's snapshot; charts from console.charts."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.db.models import Count
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_POST

from capacity.kvcost import DEFAULT_BLOCK_SIZE
from capacity.placement import DeviceRoom, EngineDemand, plan_placement
from capacity.planner import (
    VLLM_DEFAULT_MAX_NUM_SEQS,
    FleetPlan,
    MemoryPlan,
    plan_fleet,
    plan_memory,
)
from capacity.units import GIB, bytes_to_units_exact
from console.charts import Meter, Segment, UnitBlock, meter_chart, stacked_bar, unit_grid
from console.engine_forms import PlannerForm
from fairqueue.domain import QueueRow, Snapshot
from plumbing.errors import DomainError, NotFound
from plumbing.redis import redis_client
from protocol.classes import REQUEST_CLASSES
from scheduler import worker_tasks
from scheduler.batches import objects as batch_objects
from scheduler.batches import selectors as batch_selectors
from scheduler.batches import service as batches
from scheduler.batches.files import file_get, file_response
from scheduler.engines.process import log_tail
from scheduler.engines.progress import action_pending, progress_begin, progress_lines
from scheduler.engines.supervisor import engine_log_path
from scheduler.models import (
    ACTIVE_BATCH_STATUSES,
    Batch,
    BatchStatus,
    Device,
    DeviceKind,
    Engine,
    EngineStatus,
    LineState,
)
from scheduler.pools.policies import engine_pool, engine_queue, fair_queue, sync_engine
from scheduler.selectors import (
    EngineGate,
    device_list,
    device_room,
    engine_gate,
    engine_get,
    engine_list,
)
from scheduler.services import NoRoom, engine_check_room_to_start, engine_set_status
from telemetry.sampling import engine_live, gpu_live

COLOURS = {"weights": "#5b6b8c", "reserve": "#c98a2b", "kv": "#2f9e6e", "unused": "#c9ced6"}


@staff_member_required
def planner(request: HttpRequest) -> HttpResponse:
    form = PlannerForm(request.GET)
    memory: MemoryPlan | None = None
    fleet: FleetPlan | None = None
    if form.is_valid():
        data = form.cleaned_data
        try:
            memory = plan_memory(
                kv_shape=form.kv_shape,
                weights_gib=data["weights_gib"],
                gpu_memory_gib=data["gpu_memory_gib"],
                utilisation=data["utilisation"],
                reserve_gib=data["reserve_gib"],
                prompt_tokens=data["prompt_tokens"],
                output_tokens=data["output_tokens"],
                gpus_per_engine=data["gpus_per_engine"],
            )
            fleet = plan_fleet(
                peak_qps=data["peak_qps"],
                effective_utilisation=data["effective_utilisation"],
                request_throughput_qps=data["request_throughput_qps"],
                safety_factor=data["safety_factor"],
                hot_fraction=data["hot_fraction"],
                gpus_per_engine=data["gpus_per_engine"],
            )
        except ValueError as exc:
            form.add_error(None, str(exc))
    context = {
        "section": "planner",
        "form": form,
        "memory": memory,
        "fleet": fleet,
        "memory_bar": mark_safe(_memory_bar(memory)) if memory else "",
        "memory_facts": _memory_facts(memory) if memory else [],
        "max_num_seqs_default": VLLM_DEFAULT_MAX_NUM_SEQS,
    }
    return render(request, "console/planner.html", context)


def _size(nbytes: int) -> str:
    """Binary units, named as such: '128 KiB', '90.0 MiB', '55.0 GiB'."""
    for unit, scale in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{nbytes} B"


def _memory_facts(memory: MemoryPlan) -> list[tuple[str, str]]:
    cards = f" over {memory.gpus_per_engine} cards" if memory.gpus_per_engine > 1 else ""
    return [
        ("KV per token", _size(memory.bytes_per_token)),
        (
            "KV per request",
            f"{_size(memory.request_kv_bytes)} = {memory.request_kv_units:.2f} units "
            f"(whole blocks of {DEFAULT_BLOCK_SIZE} tokens)",
        ),
        (
            "KV space",
            f"{_size(memory.engine_kv_bytes)} = {memory.kv_space_units} units, "
            f"{memory.kv_tokens:,} tokens{cards}",
        ),
        (
            "Engine footprint",
            f"{memory.footprint_units} units per card "
            f"(--gpu-memory-utilization {memory.gpu_memory_utilization:g})",
        ),
    ]


def _memory_bar(memory: MemoryPlan) -> str:

    # Overfull cards draw weights and reserve past the usable line, so clip to the card.
    segments = [
        Segment("Weights", memory.weights_bytes, COLOURS["weights"], _size(memory.weights_bytes)),
        Segment(
            "Framework reserve",
            memory.reserve_bytes,
            COLOURS["reserve"],
            _size(memory.reserve_bytes),
        ),
        Segment("KV cache", memory.kv_space_bytes, COLOURS["kv"], _size(memory.kv_space_bytes)),
        Segment(
            "Left unused (utilisation)",
            memory.unused_bytes,
            COLOURS["unused"],
            _size(memory.unused_bytes),
        ),
    ]
    return stacked_bar(
        segments,
        total=memory.gpu_memory_bytes,
        title=f"Memory of one card ({_size(memory.gpu_memory_bytes)})",
    )


# --- live state: overview, engines, queues --------------------------------------------------

# Shared engines take these in turn; dedicated engines take their tenant's colour, so one
# tenant's engines read as one block on every device.
ENGINE_COLOURS = ("#2f6fb0", "#2f9e6e", "#8e5bb5", "#1b998b", "#5b6b8c", "#3d7ea6", "#7a9e2f")
TENANT_COLOURS = ("#d9480f", "#c2255c", "#e67700", "#862e9c", "#b5651d", "#0b7285")
LIVE_REFRESH_S = 5
# Engine states that change by themselves: their pages poll until they settle.
MOVING_STATUSES = (EngineStatus.STARTING, EngineStatus.WARMING, EngineStatus.DRAINING)


@dataclass(frozen=True)
class EngineRow:
    """An engine with its live numbers: the samplers' (KV usage, vLLM's running/waiting),
    the fair queue's (load as the gate sees it, reserved bytes, jobs in flight)."""

    engine: Engine
    colour: str
    pool: str
    gate: EngineGate
    kv_usage: float | None
    vllm_running: float | None
    vllm_waiting: float | None
    inflight: int
    queued_places: int  # beyond its seats, in its own queue (EnginePolicy.queued)
    reserved_units: float
    sampled_at: float | None

    @property
    def max_in_flight(self) -> int:
        return self.engine.max_num_seqs + self.queued_places


def _is_htmx(request: HttpRequest) -> bool:
    return request.headers.get("HX-Request") == "true"


def _engine_colours(engines: list[Engine]) -> dict[str, str]:
    tenants = sorted({e.dedicated_tenant.slug for e in engines if e.dedicated_tenant})
    tenant_colour = {t: TENANT_COLOURS[i % len(TENANT_COLOURS)] for i, t in enumerate(tenants)}
    colours: dict[str, str] = {}
    shared = 0
    for engine in sorted(engines, key=lambda e: e.pk):
        if engine.dedicated_tenant:
            colours[engine.name] = tenant_colour[engine.dedicated_tenant.slug]
        else:
            colours[engine.name] = ENGINE_COLOURS[shared % len(ENGINE_COLOURS)]
            shared += 1
    return colours


def _float(value: str | None) -> float | None:
    return float(value) if value else None


def _engine_rows(engines: list[Engine], snapshot: Snapshot) -> list[EngineRow]:
    queue = fair_queue()
    client = redis_client()
    colours = _engine_colours(engines)
    rows = []
    for engine in engines:
        live = engine_live(client, engine.name)
        rows.append(
            EngineRow(
                engine=engine,
                colour=colours[engine.name],
                pool=engine_pool(engine),
                gate=engine_gate(queue=queue, engine=engine),
                kv_usage=_float(live.get("kv_cache_usage")),
                vllm_running=_float(live.get("requests_running")),
                vllm_waiting=_float(live.get("requests_waiting")),
                inflight=snapshot.engine_inflight.get(engine.name, 0),
                queued_places=engine_queue(engine.max_num_seqs),
                reserved_units=bytes_to_units_exact(
                    snapshot.engine_reserved_bytes.get(engine.name, 0)
                ),
                sampled_at=_float(live.get("at")),
            )
        )
    return rows


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


def _class_totals(snapshot: Snapshot) -> list[dict[str, object]]:
    totals = []
    for request_class in REQUEST_CLASSES:
        rows = [r for r in snapshot.queues if r.request_class == request_class]
        waits = [r.oldest_wait_s for r in rows if r.oldest_wait_s is not None]
        totals.append(
            {
                "name": request_class,
                "waiting": sum(r.waiting for r in rows),
                "running": sum(r.running for r in rows),
                "oldest_wait_s": max(waits, default=None),
            }
        )
    return totals


def _overview_context() -> dict[str, object]:
    snapshot = fair_queue().snapshot()
    rows = _engine_rows(list(engine_list()), snapshot)
    return {
        "section": "overview",
        "devices": _device_views(rows),
        "engines": rows,
        "classes": _class_totals(snapshot),
        "refreshed_at": timezone.now(),
        "refresh_s": LIVE_REFRESH_S,
    }


@staff_member_required
def overview(request: HttpRequest) -> HttpResponse:
    return render(request, "console/overview.html", _overview_context())


@staff_member_required
def overview_live(request: HttpRequest) -> HttpResponse:
    """The overview's live part, which the page swaps in every few seconds."""
    return render(request, "console/_overview_live.html", _overview_context())


def _engine_or_404(name: str) -> Engine:
    try:
        return engine_get(name=name)
    except NotFound as exc:
        raise Http404(str(exc)) from None


@staff_member_required
def engine_list_page(request: HttpRequest) -> HttpResponse:
    snapshot = fair_queue().snapshot()
    rows = _engine_rows(list(engine_list()), snapshot)
    moving = any(r.engine.status in MOVING_STATUSES for r in rows)
    context = {"section": "engines", "engines": rows, "moving": moving}
    template = "console/engines/_table.html" if _is_htmx(request) else "console/engines/list.html"
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
    row = _engine_rows([engine], snapshot)[0]
    preview = _placement_preview(engine)
    others = [r for r in _engine_rows(list(engine_list()), snapshot) if r.engine.is_live]
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
    }


@staff_member_required
def engine_detail(request: HttpRequest, name: str) -> HttpResponse:
    engine = _engine_or_404(name)
    template = (
        "console/engines/_progress.html" if _is_htmx(request) else "console/engines/detail.html"
    )
    return render(request, template, _engine_context(engine))


@staff_member_required
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
    return redirect("console:engine", name=engine.name)


def _queues_context() -> dict[str, object]:
    queue = fair_queue()
    snapshot = queue.snapshot()
    pools: dict[str, list[QueueRow]] = {}
    for row in snapshot.queues:
        pools.setdefault(row.pool, []).append(row)
    gates = _engine_rows(list(engine_list()), snapshot)
    return {
        "section": "queues",
        "pools": sorted(pools.items()),
        "classes": _class_totals(snapshot),
        "gates": gates,
        "gate_chart": mark_safe(
            meter_chart(
                [
                    Meter(
                        r.engine.name,
                        r.gate.load,
                        r.gate.threshold,
                        f"load {r.gate.load:.0%}, offline below {r.gate.threshold:.0%}",
                    )
                    for r in gates
                    if r.gate.load is not None
                ],
                title="Engine load against the offline threshold",
                colour="#2f9e6e",
            )
        )
        if any(r.gate.load is not None for r in gates)
        else "",
        "tenant_reserved": [
            (tenant, bytes_to_units_exact(reserved))
            for tenant, reserved in sorted(snapshot.tenant_reserved_bytes.items())
        ],
        "refreshed_at": timezone.now(),
        "refresh_s": LIVE_REFRESH_S,
    }


@staff_member_required
def queues(request: HttpRequest) -> HttpResponse:
    return render(request, "console/queues.html", _queues_context())


@staff_member_required
def queues_live(request: HttpRequest) -> HttpResponse:
    return render(request, "console/_queues_live.html", _queues_context())


# --- batches ----------------------------------------------------------------------------------

BATCH_PAGE = 100


def _batch_or_404(batch_id: str) -> Batch:
    """Staff see every tenant's batches; the batch is found through its tenant like any read."""
    found = batch_selectors.batch_list_for_staff().filter(public_id=batch_id).first()
    if found is None:
        raise Http404(f"No batch {batch_id}.")
    return batch_selectors.batch_get(tenant=found.tenant, batch_id=batch_id)


@staff_member_required
def batch_list_page(request: HttpRequest) -> HttpResponse:
    status = request.GET.get("status", "")
    tenant = request.GET.get("tenant", "")
    shown = batch_selectors.batch_list_for_staff().order_by("-pk")
    if status in BatchStatus.values:
        shown = shown.filter(status=status)
    if tenant:
        shown = shown.filter(tenant__slug=tenant)
    rows = [(b, batch_objects.batch_progress_percent(b)) for b in shown[:BATCH_PAGE]]
    context = {
        "section": "batches",
        "rows": rows,
        "statuses": BatchStatus.values,
        "status": status,
        "tenant": tenant,
        "limit": BATCH_PAGE,
        "moving": any(b.status in ACTIVE_BATCH_STATUSES for b, _ in rows),
    }
    template = "console/batches/_table.html" if _is_htmx(request) else "console/batches/list.html"
    return render(request, template, context)


def _line_counts(batch: Batch) -> list[tuple[str, int]]:
    # order_by(): the model's default ordering would split the groups.
    grouped = batch.lines.order_by().values("state").annotate(n=Count("pk"))
    counts = {row["state"]: row["n"] for row in grouped}
    return [(state, counts.get(state, 0)) for state in LineState.values]


@staff_member_required
def batch_detail(request: HttpRequest, batch_id: str) -> HttpResponse:
    batch = _batch_or_404(batch_id)
    failed = batch.lines.filter(
        state__in=(LineState.FAILED, LineState.EXPIRED, LineState.CANCELLED)
    ).order_by("index")[:20]
    errors = (batch.errors or {}).get("data", []) if isinstance(batch.errors, dict) else []
    files = [
        (label, file_id)
        for label, file_id in (
            ("input", batch.input_file_id),
            ("output", batch.output_file_id),
            ("errors", batch.error_file_id),
        )
        if file_id
    ]
    context = {
        "section": "batches",
        "batch": batch,
        "object": batch_objects.batch_object(batch),
        "progress": batch_objects.batch_progress_percent(batch),
        "line_counts": _line_counts(batch),
        "failed_lines": failed,
        "errors": errors,
        "files": files,
        "moving": batch.status in ACTIVE_BATCH_STATUSES,
        "cancellable": batch.status in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS),
    }
    return render(request, "console/batches/detail.html", context)


@staff_member_required
def batch_file(request: HttpRequest, batch_id: str, file_id: str) -> FileResponse:
    """A batch's input, output or error file, for operators (tenants use /v1/files)."""
    batch = _batch_or_404(batch_id)
    if file_id not in (batch.input_file_id, batch.output_file_id, batch.error_file_id):
        raise Http404(f"{file_id} is not a file of batch {batch_id}.")
    try:
        stored = file_get(tenant=batch.tenant, file_id=file_id)
    except NotFound as exc:
        raise Http404(str(exc)) from None
    try:
        return file_response(stored, "application/jsonl")
    except OSError:
        raise Http404(f"The bytes of {file_id} are gone.") from None


@staff_member_required
@require_POST
def batch_cancel(request: HttpRequest, batch_id: str) -> HttpResponseRedirect:
    batch = _batch_or_404(batch_id)
    try:
        batches.batch_cancel(batch=batch)
    except DomainError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"{batch.public_id}: cancelling; running lines finish first.")
    return redirect("console:batch", batch_id=batch.public_id)
