"""What the overview, engines and queues pages share: engines' live rows (the samplers'
readers in `telemetry`), their colours, and how often the live parts refresh."""

from __future__ import annotations

from dataclasses import dataclass

from django.http import HttpRequest

from capacity.units import bytes_to_units_exact
from fairqueue.domain import Snapshot
from plumbing.redis import redis_client
from protocol.classes import REQUEST_CLASSES
from scheduler.models import (
    Engine,
    EngineStatus,
)
from scheduler.pools.policies import engine_pool, engine_queue, fair_queue
from scheduler.selectors import (
    EngineGate,
    engine_gate,
)
from telemetry.engines import engine_live

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


def is_htmx(request: HttpRequest) -> bool:
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


def engine_rows(engines: list[Engine], snapshot: Snapshot) -> list[EngineRow]:
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


def class_totals(snapshot: Snapshot) -> list[dict[str, object]]:
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
