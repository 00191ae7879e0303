"""A pool's seat bounds and its engines' seats as words and as JSON (`manage.py pool
targets`, the console's Queues page)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fairqueue.seats import ClassBound, EngineSeats
from protocol.classes import REQUEST_CLASSES
from scheduler.seats.bounds import SeatBounds


def _pairs(values: dict[str, Any], unit: str) -> str:
    return ", ".join(f"{name} {value:g}{unit}" for name, value in values.items())


def bounds_line(bounds: SeatBounds) -> str:
    """What the pool's engines hold, and where it comes from."""
    targets = _pairs(dict(bounds.ttft_targets_ms), " ms") or "none"
    fixed = _pairs(dict(bounds.fixed_seats_below), " seats") or "none"
    return (
        f"TTFT p99 targets {targets} ({bounds.targets_from}); "
        f"fixed seats below {fixed} ({bounds.fixed_from})"
    )


def bound_line(bound: ClassBound) -> str:
    """One class's bound on one engine, e.g. 'interactive: target 300 ms, p99 212 ms (180
    measured); classes below may hold 9 seats, hold 9 (full)'."""
    parts = [f"{bound.request_class}:"]
    if bound.fixed is not None:
        parts.append(f"fixed {bound.fixed} seats below;")
    if bound.target_s is not None:
        measured = (
            f"p99 {bound.p99_s * 1000:.0f} ms ({bound.samples} measured)"
            if bound.p99_s is not None
            else "not measured yet"
        )
        parts.append(f"target {bound.target_s * 1000:g} ms, {measured};")
    if bound.bound is None:
        parts.append(f"no bound now (idle), classes below hold {bound.held}")
    else:
        full = " (full)" if bound.holds_back else ""
        parts.append(f"classes below may hold {bound.bound} seats, hold {bound.held}{full}")
    return " ".join(parts)


def limit_text(report: EngineSeats, request_class: str) -> str:
    """What holds a class back on the engine, in words; '' when nothing does."""
    above = report.limits.get(request_class, "")
    if not above:
        return ""
    bound = next(b for b in report.bounds if b.request_class == above)
    why = "fixed bound" if bound.fixed is not None else "TTFT target"
    seats = "seat" if bound.bound == 1 else "seats"
    return f"{above}'s {why}: the classes below it hold {bound.held} of {bound.bound} {seats}"


def engine_line(report: EngineSeats) -> str:
    held = ", ".join(f"{c} {report.held.get(c, 0)}" for c in REQUEST_CLASSES)
    lines = [f"{report.seats} seats + {report.queued} queued; holding {held}"]
    lines += [f"    {bound_line(b)}" for b in report.bounds]
    for request_class in REQUEST_CLASSES:
        why = limit_text(report, request_class)
        if why:
            lines.append(f"    {request_class} held back by {why}")
    return "\n".join(lines)


def engine_seats_dict(report: EngineSeats) -> dict[str, Any]:
    return {
        "engine": report.engine_id,
        "seats": report.seats,
        "queued": report.queued,
        "held": dict(report.held),
        "class_seats": {c: report.class_seats(c) for c in REQUEST_CLASSES},
        "limits": dict(report.limits),
        "bounds": [
            {
                "class": b.request_class,
                "target_ms": b.target_s * 1000 if b.target_s is not None else None,
                "fixed": b.fixed,
                "bound": b.bound,
                "held": b.held,
                "p99_ms": b.p99_s * 1000 if b.p99_s is not None else None,
                "samples": b.samples,
                "source": b.source,
            }
            for b in report.bounds
        ],
    }


def pool_seats_dict(
    pool: str, bounds: SeatBounds, reports: Sequence[EngineSeats]
) -> dict[str, Any]:
    return {
        "pool": pool,
        "ttft_targets_ms": dict(bounds.ttft_targets_ms),
        "targets_from": bounds.targets_from,
        "fixed_seats_below": dict(bounds.fixed_seats_below),
        "fixed_from": bounds.fixed_from,
        "engines": [engine_seats_dict(r) for r in reports if r.pool == pool],
    }
