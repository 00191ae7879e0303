"""Where a pool's seat bounds come from: the settings, or the pool's own (PoolTargets).

The fair queue holds them on each engine (`fairqueue.domain.EnginePolicy`); `sync_engine`
copies them there with the rest of an engine's policy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction

from audit.services import audit_record, snapshot
from fairqueue.domain import BOUNDED_CLASSES, ControllerSettings
from plumbing.errors import DomainError
from scheduler.models import PoolTargets


@dataclass(frozen=True)
class SeatBounds:
    """A pool's bounds: TTFT targets in ms and fixed seats for the classes below, by the class
    they protect, and where they come from ('settings' or 'pool')."""

    ttft_targets_ms: Mapping[str, float] = field(default_factory=dict)
    fixed_seats_below: Mapping[str, int] = field(default_factory=dict)
    targets_from: str = "settings"
    fixed_from: str = "settings"

    @property
    def ttft_targets_s(self) -> dict[str, float]:
        return {name: ms / 1000 for name, ms in self.ttft_targets_ms.items()}


def checked_targets(values: Mapping[str, object], what: str) -> dict[str, float]:
    """TTFT targets by class (ms), refused with a message when a class cannot have one or a
    value is not a positive number."""
    targets: dict[str, float] = {}
    for name, value in values.items():
        _check_class(name, what)
        number = _number(value, what, name)
        if number <= 0:
            raise DomainError(f"{what}: the target of {name} must be over 0 ms, got {value!r}.")
        targets[name] = number
    return targets


def checked_fixed(values: Mapping[str, object], what: str) -> dict[str, int]:
    """Fixed seats by class: whole numbers of at least 1 (the classes below keep a seat)."""
    fixed: dict[str, int] = {}
    for name, value in values.items():
        _check_class(name, what)
        number = _number(value, what, name)
        if number < 1 or number != int(number):
            raise DomainError(
                f"{what}: the seats below {name} are a whole number >= 1, got {value!r}."
            )
        fixed[name] = int(number)
    return fixed


def _check_class(name: str, what: str) -> None:
    if name not in BOUNDED_CLASSES:
        raise DomainError(
            f"{what}: {name!r} has no classes below it to bound; "
            f"use {' or '.join(BOUNDED_CLASSES)}."
        )


def _number(value: object, what: str, name: str) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise DomainError(f"{what}: {name} must be a number, got {value!r}.") from None
    if not math.isfinite(number):
        raise DomainError(f"{what}: {name} must be a finite number, got {value!r}.")
    return number


def settings_bounds() -> SeatBounds:
    """The settings' bounds, checked (a mistake there stops the platform at its first sync
    with the setting's name in the message)."""
    return SeatBounds(
        ttft_targets_ms=checked_targets(
            settings.GPUSHARE_TTFT_TARGETS_MS, "GPUSHARE_TTFT_TARGETS_MS"
        ),
        fixed_seats_below=checked_fixed(
            settings.GPUSHARE_FIXED_SEATS_BELOW, "GPUSHARE_FIXED_SEATS_BELOW"
        ),
    )


def controller_settings() -> ControllerSettings:
    try:
        return ControllerSettings(
            quantile=float(settings.GPUSHARE_TARGET_QUANTILE),
            step=float(settings.GPUSHARE_TARGET_STEP),
            idle_s=float(settings.GPUSHARE_TARGET_IDLE_S),
        )
    except ValueError as exc:
        raise DomainError(f"GPUSHARE_TARGET_QUANTILE, _STEP or _IDLE_S: {exc}.") from None


def pool_bounds(pool: str) -> SeatBounds:
    """The bounds the pool's engines hold: the pool's own where it has them, else the
    settings'."""
    bounds = settings_bounds()
    own = PoolTargets.objects.filter(pool=pool).first()
    if own is None:
        return bounds
    if own.ttft_targets_ms is not None:
        bounds = SeatBounds(
            ttft_targets_ms=own.ttft_targets_ms, fixed_seats_below=bounds.fixed_seats_below,
            targets_from="pool", fixed_from=bounds.fixed_from,
        )  # fmt: skip
    if own.fixed_seats_below is not None:
        bounds = SeatBounds(
            ttft_targets_ms=bounds.ttft_targets_ms, fixed_seats_below=own.fixed_seats_below,
            targets_from=bounds.targets_from, fixed_from="pool",
        )  # fmt: skip
    return bounds


_UNCHANGED = object()


@transaction.atomic
def pool_targets_set(
    *, pool: str, ttft_targets_ms: object = _UNCHANGED, fixed_seats_below: object = _UNCHANGED
) -> SeatBounds:
    """Sets a pool's own targets or fixed bounds: a mapping (empty: none), or None to take
    the settings' again. Fields not given stay as they are."""
    own, _ = PoolTargets.objects.select_for_update().get_or_create(pool=pool)
    before = snapshot(own)
    if ttft_targets_ms is not _UNCHANGED:
        own.ttft_targets_ms = (
            None if ttft_targets_ms is None
            else checked_targets(ttft_targets_ms, f"pool {pool}")  # type: ignore[arg-type]
        )  # fmt: skip
    if fixed_seats_below is not _UNCHANGED:
        own.fixed_seats_below = (
            None if fixed_seats_below is None
            else checked_fixed(fixed_seats_below, f"pool {pool}")  # type: ignore[arg-type]
        )  # fmt: skip
    if own.ttft_targets_ms is None and own.fixed_seats_below is None:
        own.delete()
        after = None
    else:
        own.save()
        after = snapshot(own)
    audit_record(action="pool.targets", object_type="pool", object_id=pool, before=before,
                 after=after)  # fmt: skip
    return pool_bounds(pool)
