"""The seats of each engine by class, as the operator reads them: each class's target or
fixed bound, the measured p99 of its time to first token, the seats the classes below it
may hold now and hold, and what holds each class back (console, `/metrics/cluster`,
`manage.py pool targets`). Read without a lock: for people and dashboards."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fairqueue.domain import BOUNDED_CLASSES
from fairqueue.model import class_limit, held_below
from protocol.classes import REQUEST_CLASSES, RequestClass


def quantile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank quantile of `values`; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass(frozen=True)
class ClassBound:
    """The bound one class (`request_class`) puts on the classes below it on one engine."""

    request_class: str
    target_s: float | None  # its TTFT target; None: none
    fixed: int | None  # the operator's fixed bound; None: none
    bound: int | None  # the seats the classes below may hold now; None: no bound
    held: int  # the seats the classes below hold now
    p99_s: float | None  # of its latest times to first token there
    samples: int

    @property
    def holds_back(self) -> bool:
        return self.bound is not None and self.held >= self.bound

    @property
    def source(self) -> str:
        """What sets the bound: 'fixed', 'target', 'idle' (a target not measured lately) or
        '' (nothing)."""
        if self.fixed is not None:
            return "fixed"
        if self.target_s is None:
            return ""
        return "target" if self.bound is not None else "idle"


@dataclass(frozen=True)
class EngineSeats:
    engine_id: str
    pool: str
    seats: int  # max_num_seqs
    queued: int  # the engine's own queue
    held: Mapping[str, int]  # the seats each class holds
    bounds: tuple[ClassBound, ...] = ()
    # The class above whose bound holds each class back now ('' = none).
    limits: Mapping[str, str] = field(default_factory=dict)

    @property
    def most(self) -> int:
        return self.seats + self.queued

    def class_seats(self, request_class: str) -> int:
        """The seats `request_class` may hold now: all of them, less what the bounds above it
        keep from it and from the classes below it."""
        most = self.most
        for bound in self.bounds:
            if bound.bound is None or REQUEST_CLASSES.index(bound.request_class) >= (
                REQUEST_CLASSES.index(request_class)
            ):
                continue
            others = bound.held - self.held.get(request_class, 0)
            most = min(most, max(0, bound.bound - others))
        return most


def engine_seats(
    engine_id: str,
    engine: Mapping[str, str],
    usage: Mapping[str, str],
    samples: Mapping[str, Sequence[float]],
    now: float,
) -> EngineSeats:
    """One engine's seats from its hashes and TTFT samples (ms, by class), as the fair queue's
    scripts read them at `now` (lua/lib.lua `seats_below`, `class_limit`)."""
    standard, offline = int(usage.get("standard") or 0), int(usage.get("offline") or 0)
    held: dict[str, int] = {
        RequestClass.INTERACTIVE: int(usage.get("inflight") or 0) - standard - offline,
        RequestClass.STANDARD: standard,
        RequestClass.OFFLINE: offline,
    }
    idle_s = float(engine.get("target_idle_s") or 0.0)
    bounds: list[ClassBound] = []
    for request_class in BOUNDED_CLASSES:
        target = engine.get(f"target:{request_class}")
        fixed = engine.get(f"fixed:{request_class}")
        below = engine.get(f"below:{request_class}")
        sampled = float(engine.get(f"sampled:{request_class}") or 0.0)
        bound: int | None = None
        if fixed is not None:
            bound = int(float(fixed))
        elif target is not None and below is not None and now - sampled <= idle_s:
            bound = max(1, math.floor(float(below)))
        if target is None and fixed is None:
            continue
        ms = samples.get(request_class, ())
        p99 = quantile(ms, 0.99)
        bounds.append(
            ClassBound(
                request_class=request_class,
                target_s=float(target) if target is not None else None,
                fixed=int(float(fixed)) if fixed is not None else None,
                bound=bound,
                held=held_below(held, request_class),
                p99_s=p99 / 1000 if p99 is not None else None,
                samples=len(ms),
            )
        )
    by_class = {b.request_class: b.bound for b in bounds}
    return EngineSeats(
        engine_id=engine_id,
        pool=engine.get("pool", ""),
        seats=int(engine.get("max_num_seqs") or 0),
        queued=int(engine.get("queued") or 0),
        held=held,
        bounds=tuple(bounds),
        limits={c: class_limit(by_class, held, c) for c in REQUEST_CLASSES},
    )
