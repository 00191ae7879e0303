"""Quota reports: a tenant's usage over a period, from the usage ledger. Reads only.

Every number comes from `UsageRecord` rows (one per finished request, plus `rejected` and
`timeout` rows for requests refused before they ran: a row of refusals may stand for several,
its `requests`), always selected through the tenant.

Reservation history (reserved unit-hours, peak reserved units, time over quota) is derived
from the ledger, not from sampled snapshots: each row holds its KV reservation
(`reserved_units`) and its run interval (it ends at `finished_at` and lasted
`latency_ms - queue_wait_ms`, from the pick that reserved to the release). Summing those
intervals gives the exact reservation curve of finished requests, however short they are;
a sampler every few seconds would miss sub-second peaks and its numbers would depend on
when it ran. What the ledger cannot show: requests still running at report time, and
units held by dedicated engines (the quota is compared with KV reservations only).
The quota is the tenant's quota now (quotas have no history).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from django.db.models import Q, QuerySet, Sum
from django.db.models.functions import TruncDate

from plumbing.errors import DomainError
from protocol.classes import REQUEST_CLASSES
from tenants.models import Outcome, Tenant, UsageRecord

Period = Literal["hour", "day", "month"]
PERIODS: tuple[Period, ...] = ("hour", "day", "month")
# What a report's usage may be broken down by: the end users the requests named (`user`).
GroupBy = Literal["user"]
GROUPINGS: tuple[GroupBy, ...] = ("user",)
OUTCOMES: tuple[str, ...] = tuple(o.value for o in Outcome)
# Outcomes of requests that were admitted and ran: their waits and latencies are the
# service's; a refused or timed-out request never ran.
RAN = (Outcome.SUCCESS, Outcome.ERROR, Outcome.CANCELLED)
# A run that ends after the report's end may still have started inside it: rows finishing
# this long after the end are read too, and clipped.
_LONGEST_RUN = timedelta(hours=6)


class BadPeriod(DomainError):
    code = "bad_period"


# --- pure arithmetic ----------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), interpolated between closest ranks (numpy's default,
    PostgreSQL's percentile_cont); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    if low == high:
        return float(ordered[low])
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Reservation:
    start: float  # seconds since the epoch
    end: float
    units: float


@dataclass(frozen=True)
class ReservationSummary:
    unit_seconds: float
    peak_units: float
    seconds_over_quota: float


def reservation_summary(
    reservations: Iterable[Reservation], *, since: float, until: float, quota_units: float
) -> ReservationSummary:
    """The reservation curve (the sum of the intervals' units at each moment) within
    [since, until): its integral, its maximum and how long it stayed above the quota."""
    events: list[tuple[float, float]] = []
    for r in reservations:
        start, end = max(r.start, since), min(r.end, until)
        if end > start and r.units > 0:
            events.append((start, r.units))
            events.append((end, -r.units))
    # At one instant, releases before reservations: back-to-back requests do not stack.
    events.sort(key=lambda e: (e[0], e[1]))
    held = peak = unit_seconds = over = 0.0
    previous = since
    for moment, change in events:
        span = moment - previous
        unit_seconds += held * span
        if held > quota_units + 1e-9:
            over += span
        held += change
        peak = max(peak, held)
        previous = moment
    return ReservationSummary(unit_seconds, peak, over)


def period_start(period: Period, moment: datetime) -> datetime:
    moment = moment.astimezone(UTC)
    if period == "hour":
        return moment.replace(minute=0, second=0, microsecond=0)
    if period == "day":
        return moment.replace(hour=0, minute=0, second=0, microsecond=0)
    return moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def period_next(period: Period, start: datetime) -> datetime:
    if period == "hour":
        return start + timedelta(hours=1)
    if period == "day":
        return start + timedelta(days=1)
    return (start.replace(day=28) + timedelta(days=4)).replace(day=1)


def period_windows(
    period: Period, since: datetime, until: datetime
) -> list[tuple[datetime, datetime]]:
    """[since, until) cut at the period's boundaries (the first and last may be partial)."""
    windows = []
    start = since
    while start < until:
        end = min(period_next(period, period_start(period, start)), until)
        windows.append((start, end))
        start = end
    return windows


# --- the report ---------------------------------------------------------------------------


@dataclass(frozen=True)
class UsageReport:
    tenant: str
    since: datetime
    until: datetime
    quota_units: int
    burst_units: int
    requests: int
    requests_by_class: dict[str, dict[str, int]]
    requests_by_outcome: dict[str, int]
    prompt_tokens: int
    completion_tokens: int
    reserved_unit_hours: float
    quota_unit_hours: float
    quota_utilisation: float | None
    peak_reserved_units: float
    seconds_over_quota: float
    queue_wait_ms: dict[str, float | None]
    latency_ms: dict[str, float | None]
    rejected_429: int
    rejections_by_status: dict[str, int]
    timeouts: int
    # Per end user, when asked (`usage_by_user`: the first MAX_USERS of `users`); None
    # otherwise.
    by_user: list[dict[str, Any]] | None = None
    users: int = 0

    @property
    def hours(self) -> float:
        return (self.until - self.since).total_seconds() / 3600.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "hours": round(self.hours, 6),
            "quota_units": self.quota_units,
            "burst_units": self.burst_units,
            "requests": {
                "total": self.requests,
                "by_outcome": self.requests_by_outcome,
                "by_class": self.requests_by_class,
            },
            "tokens": {
                "prompt": self.prompt_tokens,
                "completion": self.completion_tokens,
                "total": self.prompt_tokens + self.completion_tokens,
            },
            # Unrounded: one small request holds a few thousandths of a unit for milliseconds.
            "reservation": {
                "reserved_unit_hours": self.reserved_unit_hours,
                "quota_unit_hours": self.quota_unit_hours,
                "quota_utilisation": self.quota_utilisation,
                "peak_reserved_units": self.peak_reserved_units,
                "seconds_over_quota": self.seconds_over_quota,
            },
            "queue_wait_ms": self.queue_wait_ms,
            "latency_ms": self.latency_ms,
            "rejected_429": self.rejected_429,
            "rejections_by_status": self.rejections_by_status,
            "timeouts": self.timeouts,
        } | ({"users": self.users, "by_user": self.by_user} if self.by_user is not None else {})


def usage_records(*, tenant: Tenant, since: datetime, until: datetime) -> QuerySet[UsageRecord]:
    """The tenant's ledger rows finished in [since, until)."""
    return UsageRecord.objects.filter(tenant=tenant, finished_at__gte=since, finished_at__lt=until)


@dataclass(frozen=True)
class PrefixCacheUse:
    """Of a tenant's prompt tokens in a period, those its engines' prefix caches held."""

    prompt_tokens: int
    cached_tokens: int

    @property
    def hit_rate(self) -> float | None:
        """cached / prompt tokens; None when it sent no prompt tokens."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None


def prefix_cache_use(*, tenant: Tenant, since: datetime, until: datetime) -> PrefixCacheUse:
    totals = usage_records(tenant=tenant, since=since, until=until).aggregate(
        prompt=Sum("prompt_tokens"), cached=Sum("cached_tokens")
    )
    return PrefixCacheUse(int(totals["prompt"] or 0), int(totals["cached"] or 0))


def _percentiles(values: Sequence[float]) -> dict[str, float | None]:
    return {f"p{q}": percentile(values, q) for q in (50, 95, 99)}


def check_report_size(*, tenant: Tenant, since: datetime, until: datetime, max_rows: int) -> None:
    """BadPeriod when [since, until) holds more than `max_rows` of the tenant's ledger rows
    (counted on the tenant-and-time index, without reading them)."""
    rows = usage_records(tenant=tenant, since=since, until=until)[: max_rows + 1].count()
    if rows > max_rows:
        raise BadPeriod(
            f"That range holds more than {max_rows} requests of the ledger, more than one "
            "report reads; ask for a shorter range."
        )


# The most end users a report lists, most tokens first; `users` says how many there were.
MAX_USERS = 1000


def usage_by_user(
    *, tenant: Tenant, since: datetime, until: datetime
) -> tuple[list[dict[str, Any]], int]:
    """The range's requests and tokens per end user (the `user` its requests named; '' for
    those that named none, and for refusals before admission, whose rows stand for a key's
    refusals of a second), the MAX_USERS with most tokens first, and how many end users
    there were. Grouped by the database, over the rows a report reads."""
    records = usage_records(tenant=tenant, since=since, until=until).order_by()
    per_outcome = {o: Sum("requests", filter=Q(outcome=o), default=0) for o in OUTCOMES}
    rows = (
        records.values("end_user")
        .annotate(
            n=Sum("requests"),
            prompt=Sum("prompt_tokens"),
            completion=Sum("completion_tokens"),
            total=Sum("prompt_tokens") + Sum("completion_tokens"),
            **per_outcome,
        )
        .order_by("-total", "-n", "end_user")[:MAX_USERS]
    )
    users = [
        {
            "user": row["end_user"],
            "requests": {"total": row["n"], "by_outcome": {o: row[o] for o in OUTCOMES}},
            "tokens": {
                "prompt": row["prompt"],
                "completion": row["completion"],
                "total": row["total"],
            },
        }
        for row in rows
    ]
    count = len(users) if len(users) < MAX_USERS else records.values("end_user").distinct().count()
    return users, count


def tenant_usage_report(
    *, tenant: Tenant, since: datetime, until: datetime, group_by: GroupBy | None = None
) -> UsageReport:
    if until <= since:
        raise BadPeriod(f"The report's end ({until.isoformat()}) is not after its start.")
    by_class = {c: dict.fromkeys(OUTCOMES, 0) for c in REQUEST_CLASSES}
    by_outcome = dict.fromkeys(OUTCOMES, 0)
    by_status: dict[str, int] = {}
    prompt = completion = requests = 0
    waits: list[float] = []
    latencies: list[float] = []
    rows = usage_records(tenant=tenant, since=since, until=until).values_list(
        "request_class", "outcome", "status_code", "prompt_tokens", "completion_tokens",
        "queue_wait_ms", "latency_ms", "requests",
    )  # fmt: skip
    for request_class, outcome, status, prompt_tokens, completion_tokens, wait, latency, n in rows:
        requests += n
        by_class.setdefault(request_class, dict.fromkeys(OUTCOMES, 0))[outcome] += n
        by_outcome[outcome] += n
        prompt += prompt_tokens
        completion += completion_tokens
        if outcome in RAN:
            waits.append(wait)
            latencies.append(latency)
        else:
            by_status[str(status)] = by_status.get(str(status), 0) + n
    reservations = (
        Reservation(
            start=finished.timestamp() - max(0, latency - wait) / 1000.0,
            end=finished.timestamp(),
            units=units,
        )
        for finished, latency, wait, units in UsageRecord.objects.filter(
            tenant=tenant,
            finished_at__gte=since,
            finished_at__lt=until + _LONGEST_RUN,
            reserved_units__gt=0,
        ).values_list("finished_at", "latency_ms", "queue_wait_ms", "reserved_units")
    )
    summary = reservation_summary(
        reservations,
        since=since.timestamp(),
        until=until.timestamp(),
        quota_units=tenant.quota_units,
    )
    by_user, users = None, 0
    if group_by == "user":
        by_user, users = usage_by_user(tenant=tenant, since=since, until=until)
    hours = (until - since).total_seconds() / 3600.0
    quota_unit_hours = tenant.quota_units * hours
    reserved_unit_hours = summary.unit_seconds / 3600.0
    return UsageReport(
        tenant=tenant.slug,
        since=since,
        until=until,
        quota_units=tenant.quota_units,
        burst_units=tenant.burst_units,
        requests=requests,
        requests_by_class=by_class,
        requests_by_outcome=by_outcome,
        prompt_tokens=prompt,
        completion_tokens=completion,
        reserved_unit_hours=reserved_unit_hours,
        quota_unit_hours=quota_unit_hours,
        quota_utilisation=reserved_unit_hours / quota_unit_hours if quota_unit_hours else None,
        peak_reserved_units=summary.peak_units,
        seconds_over_quota=summary.seconds_over_quota,
        queue_wait_ms=_percentiles(waits),
        latency_ms=_percentiles(latencies),
        rejected_429=by_status.get("429", 0),
        rejections_by_status=dict(sorted(by_status.items())),
        timeouts=by_outcome[Outcome.TIMEOUT],
        by_user=by_user,
        users=users,
    )


def tenant_usage_reports(
    *,
    tenant: Tenant,
    since: datetime,
    until: datetime,
    per: Period | None = None,
    group_by: GroupBy | None = None,
) -> list[UsageReport]:
    """One report for [since, until), or one per hour/day/month within it; each broken down
    by `group_by` too, where asked."""
    if until <= since:
        raise BadPeriod(f"The report's end ({until.isoformat()}) is not after its start.")
    if per and (until - since) / _SHORTEST[per] > MAX_PERIODS:
        raise BadPeriod(
            f"That range holds more than {MAX_PERIODS} {per}s; ask for a shorter range or a "
            "longer period."
        )
    windows = period_windows(per, since, until) if per else [(since, until)]
    return [
        tenant_usage_report(tenant=tenant, since=s, until=u, group_by=group_by) for s, u in windows
    ]


# A report split into periods is computed period by period: bounded, so that no request can
# ask for millions of them.
MAX_PERIODS = 1000
_SHORTEST = {"hour": timedelta(hours=1), "day": timedelta(days=1), "month": timedelta(days=28)}


def report_range(
    *,
    since: datetime | None,
    until: datetime | None,
    period: Period | None,
    now: datetime | None = None,
) -> tuple[datetime, datetime]:
    """What a caller asked for: an explicit range, or the current hour/day/month (until
    now), or, with neither, the current month."""
    now = now or datetime.now(tz=UTC)
    if since is None:
        since = period_start(period or "month", now)
    until = until or now
    if until <= since:
        raise BadPeriod(f"The report's end ({until.isoformat()}) is not after its start.")
    return since, until


CSV_COLUMNS = (
    "tenant", "since", "until", "hours", "quota_units", "burst_units", "requests",
    *(f"requests_{o}" for o in OUTCOMES),
    *(f"requests_{c}" for c in REQUEST_CLASSES),
    "prompt_tokens", "completion_tokens", "reserved_unit_hours", "quota_unit_hours",
    "quota_utilisation", "peak_reserved_units", "seconds_over_quota",
    "queue_wait_p50_ms", "queue_wait_p95_ms", "queue_wait_p99_ms",
    "latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "rejected_429", "timeouts",
)  # fmt: skip


def report_row(report: UsageReport) -> dict[str, Any]:
    """A report as one flat row (CSV, tables)."""
    data = report.as_dict()
    row: dict[str, Any] = {
        "tenant": report.tenant,
        "since": data["since"],
        "until": data["until"],
        "hours": data["hours"],
        "quota_units": report.quota_units,
        "burst_units": report.burst_units,
        "requests": report.requests,
        "prompt_tokens": report.prompt_tokens,
        "completion_tokens": report.completion_tokens,
        **data["reservation"],
        "rejected_429": report.rejected_429,
        "timeouts": report.timeouts,
    }
    for outcome, count in report.requests_by_outcome.items():
        row[f"requests_{outcome}"] = count
    for request_class, outcomes in report.requests_by_class.items():
        row[f"requests_{request_class}"] = sum(outcomes.values())
    for name, values in (("queue_wait", report.queue_wait_ms), ("latency", report.latency_ms)):
        for q, value in values.items():
            row[f"{name}_{q}_ms"] = round(value, 3) if value is not None else ""
    if row["quota_utilisation"] is None:
        row["quota_utilisation"] = ""
    return {column: row.get(column, "") for column in CSV_COLUMNS}


def reports_csv(reports: Iterable[UsageReport]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for report in reports:
        writer.writerow(report_row(report))
    return out.getvalue()


# What the portal's usage page breaks a range down by: the ledger's own columns.
Breakdown = Literal["day", "model", "api_key", "end_user"]
BREAKDOWNS: tuple[Breakdown, ...] = ("day", "model", "api_key", "end_user")


def usage_breakdown(
    *, tenant: Tenant, since: datetime, until: datetime, by: Breakdown
) -> list[dict[str, Any]]:
    """The tenant's requests, tokens and reserved unit-hours in [since, until), one row per
    day (UTC), model, key or end user, summed by the database. A row's `label` is the day,
    the model, the key's prefix and name, or the end user ('' when the request named none)."""
    records = usage_records(tenant=tenant, since=since, until=until).order_by()
    grouped: Any
    if by == "day":
        grouped = records.annotate(group=TruncDate("finished_at", tzinfo=UTC)).values("group")
    elif by == "api_key":
        grouped = records.values("api_key__prefix", "api_key__name")
    else:
        grouped = records.values(by)
    rows = grouped.annotate(
        n=Sum("requests"),
        prompt=Sum("prompt_tokens"),
        completion=Sum("completion_tokens"),
        unit_seconds=Sum("reserved_unit_seconds"),
    )
    result = []
    for row in rows:
        if by == "day":
            label = row["group"].isoformat()
        elif by == "api_key":
            prefix = row["api_key__prefix"]
            label = f"{prefix}… {row['api_key__name']}" if prefix else "(no key)"
        else:
            label = row[by]
        result.append(
            {
                "label": label,
                "requests": row["n"] or 0,
                "prompt_tokens": row["prompt"] or 0,
                "completion_tokens": row["completion"] or 0,
                "tokens": (row["prompt"] or 0) + (row["completion"] or 0),
                "unit_hours": (row["unit_seconds"] or 0.0) / 3600,
            }
        )
    key = "label" if by == "day" else "tokens"
    return sorted(result, key=lambda r: r[key], reverse=by != "day")
