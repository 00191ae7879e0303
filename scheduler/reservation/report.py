"""A pool's KV reservations as text and JSON (`manage.py pool reservation`, the console)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from capacity.units import UNIT_BYTES
from fairqueue.reservations import EngineReservation
from scheduler.reservation.modes import Reservation


def _units(nbytes: int) -> str:
    return f"{nbytes / UNIT_BYTES:.2f} units"


def mode_line(reservation: Reservation) -> str:
    if reservation.mode == "worst":
        return f"worst case ({reservation.source})"
    return (
        f"predict: prompt + p{reservation.output_quantile * 100:g} of the tenant's latest "
        f"answers, growing as it generates ({reservation.source})"
    )


def engine_line(report: EngineReservation) -> str:
    """e.g. 'budget 4.00 units, picks may fill 80 %; reserved 1.20 units, measured beyond
    it 0.10 units; free 1.90 units'."""
    parts = [f"budget {_units(report.budget_bytes)}"]
    if report.mode == "predict":
        parts[0] += f", picks may fill {report.scale * 100:.0f} %"
    parts.append(f"reserved {_units(report.reserved_bytes)}")
    if report.mode == "predict":
        parts[-1] += (
            ", not measured lately"
            if report.excess_bytes is None
            else f", measured beyond it {_units(report.excess_bytes)}"
        )
    parts.append(f"free {_units(report.free_bytes)}")
    return "; ".join(parts)


def pool_reservation_dict(
    pool: str,
    reservation: Reservation,
    reports: Sequence[EngineReservation],
    predictions: Mapping[str, int],
) -> dict[str, Any]:
    return {
        "pool": pool,
        "mode": reservation.mode,
        "source": reservation.source,
        "output_quantile": reservation.output_quantile,
        "predicted_output_tokens": dict(sorted(predictions.items())),
        "engines": [
            {
                "engine": r.engine_id,
                "mode": r.mode,
                "budget_bytes": r.budget_bytes,
                "scale": r.scale,
                "reserved_bytes": r.reserved_bytes,
                "excess_bytes": r.excess_bytes,
                "free_bytes": r.free_bytes,
            }
            for r in reports
            if r.pool == pool
        ],
    }
