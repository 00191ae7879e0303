"""The queues page: the fair queue's snapshot by pool, tenant and class, and why each engine's
offline gate is open or shut."""

from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.safestring import mark_safe

from capacity.units import bytes_to_units_exact
from console.charts import Meter, meter_chart
from console.live import LIVE_REFRESH_S, class_totals, engine_rows
from fairqueue.domain import QueueRow
from scheduler.pools.policies import fair_queue
from scheduler.selectors import (
    engine_list,
)


def _queues_context() -> dict[str, object]:
    queue = fair_queue()
    snapshot = queue.snapshot()
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
