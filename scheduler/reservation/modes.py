"""Where a pool's KV reservation mode comes from: the settings (GPUSHARE_KV_RESERVATION), or
the pool's own (PoolReservation). The fair queue holds it on each engine
(`fairqueue.domain.EnginePolicy.reservation`); `sync_engine` copies it there."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from audit.services import audit_record, snapshot
from fairqueue.domain import RESERVATION_MODES
from plumbing.errors import DomainError
from scheduler.models import PoolReservation


@dataclass(frozen=True)
class Reservation:
    """A pool's mode, the quantile of its tenants' answers a prediction takes, and where the
    mode comes from ('settings' or 'pool')."""

    mode: str
    output_quantile: float
    source: str = "settings"


def checked_mode(value: object, what: str) -> str:
    mode = str(value).strip().lower()
    if mode not in RESERVATION_MODES:
        raise DomainError(
            f"{what}: the KV reservation is {' or '.join(RESERVATION_MODES)}, got {value!r}."
        )
    return mode


def settings_reservation() -> Reservation:
    """The settings' mode and quantile, checked (a mistake there stops the platform at its
    first sync with the setting's name in the message)."""
    quantile = float(settings.GPUSHARE_OUTPUT_QUANTILE)
    if not 0.5 <= quantile <= 1:
        raise DomainError(f"GPUSHARE_OUTPUT_QUANTILE is in [0.5, 1], got {quantile!r}.")
    mode = checked_mode(settings.GPUSHARE_KV_RESERVATION, "GPUSHARE_KV_RESERVATION")
    return Reservation(mode=mode, output_quantile=quantile)


def pool_reservation(pool: str) -> Reservation:
    """The mode the pool's engines hold: the pool's own where it has one, else the settings'."""
    base = settings_reservation()
    own = PoolReservation.objects.filter(pool=pool).first()
    if own is None:
        return base
    return Reservation(mode=own.mode, output_quantile=base.output_quantile, source="pool")


@transaction.atomic
def pool_reservation_set(*, pool: str, mode: str | None) -> Reservation:
    """Sets a pool's own mode, or (None) makes it take the settings' again."""
    before = snapshot(PoolReservation.objects.filter(pool=pool).first())
    if mode is None:
        PoolReservation.objects.filter(pool=pool).delete()
    else:
        PoolReservation.objects.update_or_create(
            pool=pool, defaults={"mode": checked_mode(mode, f"pool {pool}")}
        )
    after = snapshot(PoolReservation.objects.filter(pool=pool).first())
    audit_record(action="pool.reservation", object_type="pool", object_id=pool, before=before,
                 after=after)  # fmt: skip
    return pool_reservation(pool)
