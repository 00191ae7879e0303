"""The queues page: the fair queue's snapshot by pool, tenant and class, why each engine's
offline gate is open or shut, each engine's seats by class (the bounds that hold latency
targets, what they let each class hold, and what holds a class back), and each engine's KV
reservations (the mode, what jobs reserve, what the engine holds beyond that, preemptions)."""

from __future__ import annotations

from dataclasses import dataclass

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.safestring import mark_safe

from capacity.units import bytes_to_units_exact
from console.charts import Meter, meter_chart
from console.live import LIVE_REFRESH_S, class_totals, engine_rows
from fairqueue.domain import QueueRow
from fairqueue.queue import FairQueue
from fairqueue.reservations import EngineReservation
from fairqueue.seats import ClassBound, EngineSeats
from plumbing.errors import DomainError
from protocol.classes import REQUEST_CLASSES
from scheduler.pools.policies import fair_queue
from scheduler.reservation.modes import pool_reservation
from scheduler.reservation.report import mode_line
from scheduler.seats.bounds import pool_bounds
from scheduler.seats.report import bounds_line, limit_text
from scheduler.selectors import (
    engine_list,
)
from staff.access import console_permission
from staff.roles import Perm
from telemetry.engines import engine_live


@dataclass(frozen=True)
class ClassSeats:
    """One class on one engine: the seats it holds and may hold now, the bound it sets on the
    classes below it (none for offline, the lowest), and what holds it back."""

    request_class: str
    held: int
    may_hold: int  # EngineSeats.class_seats: what the bounds above it leave it now
    bound: ClassBound | None
    held_back_by: str  # limit_text: '' while nothing holds it back

    @property
    def setting(self) -> str:
        """What the operator set: its TTFT target, its fixed bound, or both."""
        if self.bound is None:
            return ""
        parts = []
        if self.bound.target_s is not None:
            parts.append(f"target {self.bound.target_s * 1000:g} ms")
        if self.bound.fixed is not None:
            parts.append(f"fixed {self.bound.fixed} seats below")
        return ", ".join(parts)

    @property
    def measured(self) -> str:
        bound = self.bound
        if bound is None or bound.target_s is None:
            return ""
        if bound.p99_s is None:
            return "not measured yet"
        return f"{bound.p99_s * 1000:.0f} ms ({bound.samples} measured)"

    @property
    def over_target(self) -> bool:
        bound = self.bound
        return bool(
            bound and bound.target_s is not None and bound.p99_s is not None
            and bound.p99_s > bound.target_s
        )  # fmt: skip

    @property
    def below_percent(self) -> int | None:
        """The share of its bound the classes below hold (the bar); None: no bound now."""
        bound = self.bound
        if bound is None or bound.bound is None:
            return None
        return min(100, round(100 * bound.held / bound.bound)) if bound.bound else 100


@dataclass(frozen=True)
class EngineClassSeats:
    report: EngineSeats
    classes: list[ClassSeats]


def _class_seats(report: EngineSeats) -> EngineClassSeats:
    bounds = {b.request_class: b for b in report.bounds}
    return EngineClassSeats(
        report=report,
        classes=[
            ClassSeats(
                request_class=request_class,
                held=report.held.get(request_class, 0),
                may_hold=report.class_seats(request_class),
                bound=bounds.get(request_class),
                held_back_by=limit_text(report, request_class),
            )
            for request_class in REQUEST_CLASSES
        ],
    )


def _seat_pools(reports: list[EngineSeats]) -> list[tuple[str, str, list[EngineClassSeats]]]:
    """Per pool: where its bounds come from, in words, and its engines' seats by class."""
    pools: dict[str, list[EngineClassSeats]] = {}
    for report in reports:
        pools.setdefault(report.pool, []).append(_class_seats(report))
    return [(pool, _bounds_words(pool), pools[pool]) for pool in sorted(pools)]


def _bounds_words(pool: str) -> str:
    try:
        return bounds_line(pool_bounds(pool))
    except DomainError as exc:  # a mistake in the settings: the page says so, and stands
        return exc.message


@dataclass(frozen=True)
class EngineKv:
    """One engine's KV reservations on the queues page (`fairqueue.reservations`), with the
    requests it preempted since it started (its telemetry)."""

    report: EngineReservation
    preemptions: float | None

    @property
    def reserved_percent(self) -> float:
        budget = self.report.budget_bytes
        return min(100.0, 100.0 * self.report.reserved_bytes / budget) if budget else 0.0

    @property
    def units(self) -> dict[str, float]:
        r = self.report
        return {
            "budget": bytes_to_units_exact(r.budget_bytes),
            "reserved": bytes_to_units_exact(r.reserved_bytes),
            "excess": bytes_to_units_exact(r.excess_bytes or 0),
            "free": bytes_to_units_exact(max(0, r.free_bytes)),
        }


def _kv_pools(queue: FairQueue) -> list[tuple[str, str, list[EngineKv], dict[str, int]]]:
    """Per pool: its mode in words, its engines' KV, each tenant's predicted output."""
    pools: dict[str, list[EngineKv]] = {}
    for report in queue.reservation_reports():
        live = engine_live(queue.redis, report.engine_id)
        preempted = live.get("preemptions_total")
        pools.setdefault(report.pool, []).append(
            EngineKv(report, float(preempted) if preempted else None)
        )
    return [
        (pool, _mode_words(pool), pools[pool], queue.output_predictions(pool))
        for pool in sorted(pools)
    ]


def _mode_words(pool: str) -> str:
    try:
        return mode_line(pool_reservation(pool))
    except DomainError as exc:
        return exc.message


def _queues_context() -> dict[str, object]:
    queue = fair_queue()
    snapshot = queue.snapshot()
    reports = queue.seat_reports()
    pools: dict[str, list[QueueRow]] = {}
    for row in snapshot.queues:
        pools.setdefault(row.pool, []).append(row)
    gates = engine_rows(list(engine_list()), snapshot)
    return {
        "section": "queues",
        "pools": sorted(pools.items()),
        "classes": class_totals(snapshot),
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
        # Seats by class: shown while an engine has a bound; else a note on how to set one.
        "seat_pools": _seat_pools(reports) if any(r.bounds for r in reports) else [],
        "kv_pools": _kv_pools(queue),
        "tenant_reserved": [
            (tenant, bytes_to_units_exact(reserved))
            for tenant, reserved in sorted(snapshot.tenant_reserved_bytes.items())
        ],
        "refreshed_at": timezone.now(),
        "refresh_s": LIVE_REFRESH_S,
    }


@console_permission(Perm.VIEW)
def queues(request: HttpRequest) -> HttpResponse:
    return render(request, "console/queues.html", _queues_context())


@console_permission(Perm.VIEW)
def queues_live(request: HttpRequest) -> HttpResponse:
    return render(request, "console/_queues_live.html", _queues_context())
