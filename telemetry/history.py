"""Sampled history: rows at full resolution, downsampled as they age and dropped past
retention (`telemetry_rollup`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.db import transaction

from telemetry.models import EngineSample, GpuSample, Resolution, Sample
from telemetry.smoothing import (
    Point,
    downsample,
)

# --- history: downsampling and retention --------------------------------------------------


@dataclass(frozen=True)
class RollupReport:
    to_minute: int = 0
    to_hour: int = 0
    dropped: int = 0


_BUCKET_S: dict[str, int] = {Resolution.MINUTE: 60, Resolution.HOUR: 3600}


S = TypeVar("S", bound=Sample)


def _fold(
    model: type[S],
    source: str,
    target: str,
    cutoff: datetime,
) -> int:
    """Rows of `source` resolution before `cutoff` become `target` buckets (the cutoff is
    bucket-aligned, so every bucket folded is complete). A target bucket that exists
    already (a late sample) is folded again with the newcomers, weighted by samples."""
    size = _BUCKET_S[target]
    series_fields, value_fields = model.SERIES_FIELDS, model.VALUE_FIELDS
    with transaction.atomic():
        rows = list(model._default_manager.filter(resolution=source, at__lt=cutoff).order_by("at"))
        if not rows:
            return 0
        first = datetime.fromtimestamp(int(rows[0].at.timestamp()) // size * size, tz=UTC)
        existing = list(
            model._default_manager.filter(resolution=target, at__gte=first, at__lt=cutoff)
        )
        by_series: dict[tuple[Any, ...], list[Point]] = {}
        for row in [*existing, *rows]:
            series = tuple(getattr(row, f) for f in series_fields)
            by_series.setdefault(series, []).append(
                Point(
                    at=row.at.timestamp(),
                    values={f: getattr(row, f) for f in value_fields},
                    samples=row.samples,
                )
            )
        folded: list[S] = []
        for series, points in by_series.items():
            for bucket in downsample(points, size):
                folded.append(
                    model(
                        **dict(zip(series_fields, series, strict=True)),
                        resolution=target,
                        at=datetime.fromtimestamp(bucket.at, tz=UTC),
                        samples=bucket.samples,
                        **{f: bucket.values.get(f) for f in value_fields},
                    )
                )
        model._default_manager.filter(pk__in=[r.pk for r in existing]).delete()
        model._default_manager.filter(pk__in=[r.pk for r in rows]).delete()
        model._default_manager.bulk_create(folded)
    return len(rows)


def _aligned(moment: datetime, size_s: int) -> datetime:
    return datetime.fromtimestamp(int(moment.timestamp()) // size_s * size_s, tz=UTC)


def telemetry_rollup(*, now: datetime | None = None) -> RollupReport:
    """Raw samples older than the raw window become per-minute means, per-minute older than
    the minute window become per-hour means, anything older than the retention is dropped."""
    now = now or datetime.now(tz=UTC)
    raw_cutoff = _aligned(now - timedelta(days=settings.GPUSHARE_TELEMETRY_RAW_DAYS), 60)
    minute_cutoff = _aligned(now - timedelta(days=settings.GPUSHARE_TELEMETRY_MINUTE_DAYS), 3600)
    retention_cutoff = now - timedelta(days=settings.GPUSHARE_TELEMETRY_RETENTION_DAYS)
    to_minute = to_hour = dropped = 0
    models: tuple[type[Sample], ...] = (GpuSample, EngineSample)
    for model in models:
        to_minute += _fold(model, Resolution.RAW, Resolution.MINUTE, raw_cutoff)
        to_hour += _fold(model, Resolution.MINUTE, Resolution.HOUR, minute_cutoff)
        dropped += model._default_manager.filter(at__lt=retention_cutoff).delete()[0]
    return RollupReport(to_minute=to_minute, to_hour=to_hour, dropped=dropped)
