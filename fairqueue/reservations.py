"""KV reservations of each engine as the operator reads them: the mode, the budget picks may
fill (scaled down while the engine preempts), what jobs reserve and what the engine measures
in use beyond that, and each tenant's predicted output (console, `/metrics/cluster`, `manage.py pool
reservation`). Read without a lock: for people and dashboards."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# A measure of KV in use older than this counts for nothing (`lua/lib.lua` KV_MEASURE_S).
KV_MEASURE_S = 30.0


@dataclass(frozen=True)
class EngineReservation:
    engine_id: str
    pool: str
    mode: str  # 'predict' or 'worst'
    budget_bytes: int
    scale: float  # of the budget that picks may fill (predict mode; 1 otherwise)
    reserved_bytes: int  # what its running jobs reserve
    # What the engine measured in use beyond the reservations at its last reading, when recent.
    excess_bytes: int | None

    @property
    def free_bytes(self) -> int:
        """The room a pick sees (`lua/lib.lua` engine_free)."""
        if self.mode != "predict":
            return self.budget_bytes - self.reserved_bytes
        held = self.reserved_bytes + (self.excess_bytes or 0)
        return int(self.budget_bytes * self.scale) - held


def engine_reservation(
    engine_id: str, fields: Mapping[str, str], usage: Mapping[str, str], now: float
) -> EngineReservation:
    mode = fields.get("reservation") or "worst"
    measured_at = float(fields.get("kv_used_at") or 0.0)
    fresh = now - measured_at <= KV_MEASURE_S
    excess = int(fields.get("kv_excess_bytes") or 0) if fresh else None
    return EngineReservation(
        engine_id=engine_id,
        pool=fields.get("pool", ""),
        mode=mode,
        budget_bytes=int(fields.get("kv_budget_bytes") or 0),
        scale=float(fields.get("kv_scale") or 1.0) if mode == "predict" else 1.0,
        reserved_bytes=int(usage.get("reserved") or 0),
        excess_bytes=excess,
    )
