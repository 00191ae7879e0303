"""Placement: which device each engine runs on, packed by memory units.

First-fit decreasing: the biggest engines are placed first, each on the first device (in the
order given, so a node's GPUs fill in index order) with enough free units. A device is never
given more than its capacity. What does not fit is refused with the numbers an operator needs:
which device comes closest and by how many units it is short.

Dedicated engines belong to one tenant and count against that tenant's quota; the check is
pure here, the caller passes the numbers it read from the database.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from capacity.units import format_units


@dataclass(frozen=True)
class DeviceRoom:
    """A device as placement sees it: its capacity and what engines already hold."""

    key: str
    capacity_units: int
    used_units: int = 0

    @property
    def free_units(self) -> int:
        return self.capacity_units - self.used_units


@dataclass(frozen=True)
class EngineDemand:
    name: str
    units: int


@dataclass(frozen=True)
class Refusal:
    engine: str
    units: int
    reason: str


@dataclass
class PlacementPlan:
    assignments: dict[str, str] = field(default_factory=dict)
    free_units: dict[str, int] = field(default_factory=dict)
    refusals: list[Refusal] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.refusals


class PlacementError(ValueError):
    """Some engines do not fit. `refusals` says which and why."""

    def __init__(self, refusals: Sequence[Refusal]) -> None:
        self.refusals = list(refusals)
        super().__init__("; ".join(refusal.reason for refusal in self.refusals))


class DedicatedQuotaError(ValueError):
    """A dedicated engine would take its tenant over quota."""


def _shortfall_reason(demand: EngineDemand, free: dict[str, int], capacity: dict[str, int]) -> str:
    if not free:
        return f"engine {demand.name!r} needs {format_units(demand.units)}: there is no device"
    closest = max(free, key=lambda key: free[key])
    short = demand.units - free[closest]
    return (
        f"engine {demand.name!r} needs {format_units(demand.units)} but no device has room: "
        f"the roomiest, {closest}, has {free[closest]} of {capacity[closest]} units free "
        f"and is short by {short} unit{'s' if short != 1 else ''}"
    )


def plan_placement(engines: Iterable[EngineDemand], devices: Sequence[DeviceRoom]) -> PlacementPlan:
    """Pack `engines` onto `devices` first-fit decreasing; what does not fit is refused."""
    free = {device.key: device.free_units for device in devices}
    capacity = {device.key: device.capacity_units for device in devices}
    plan = PlacementPlan()
    # Ties keep a stable, readable order (by name), so the same input gives the same plan.
    for demand in sorted(engines, key=lambda e: (-e.units, e.name)):
        if demand.units <= 0:
            plan.refusals.append(
                Refusal(demand.name, demand.units, f"engine {demand.name!r} needs at least 1 unit")
            )
            continue
        target = next((key for key in free if free[key] >= demand.units), None)
        if target is None:
            reason = _shortfall_reason(demand, free, capacity)
            plan.refusals.append(Refusal(demand.name, demand.units, reason))
            continue
        free[target] -= demand.units
        plan.assignments[demand.name] = target
    plan.free_units = free
    return plan


def place_engines(engines: Iterable[EngineDemand], devices: Sequence[DeviceRoom]) -> PlacementPlan:
    """Like plan_placement, but all or nothing: raises PlacementError if any engine is refused."""
    plan = plan_placement(engines, devices)
    if not plan.complete:
        raise PlacementError(plan.refusals)
    return plan


def choose_device(demand: EngineDemand, devices: Sequence[DeviceRoom]) -> str:
    """The device a new engine goes on, given what running engines already hold."""
    return place_engines([demand], devices).assignments[demand.name]


def check_fits_device(demand: EngineDemand, device: DeviceRoom) -> None:
    """An operator pinned the device: it must still have room."""
    place_engines([demand], [device])


def check_dedicated_quota(
    *, tenant: str, quota_units: int, dedicated_units_held: int, new_units: int
) -> None:
    """A dedicated engine holds its units for one tenant all the time, so it counts against
    that tenant's quota like a permanent reservation. Refuse one that would exceed it."""
    total = dedicated_units_held + new_units
    if total > quota_units:
        raise DedicatedQuotaError(
            f"tenant {tenant!r} has a quota of {format_units(quota_units)} and already holds "
            f"{dedicated_units_held} units in dedicated engines; another {new_units} would make "
            f"{total}, over quota by {total - quota_units} units"
        )


def request_quota_units(*, quota_units: int, dedicated_units: int) -> int:
    """What is left of a tenant's quota for KV reservations once its dedicated engines are
    counted (never negative: an operator may lower a quota below what engines hold)."""
    return max(0, quota_units - dedicated_units)
