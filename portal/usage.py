"""The usage page: the tenant's requests, tokens and reserved unit-hours by day, model, key
and end user, from the usage ledger (`tenants.reports`), with charts. Spend in money is the
billing's to fill (the `spend` block of portal/usage.html): here it shows today's usage."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.safestring import mark_safe

from console.charts import Series, line_chart
from portal.access import page_context, portal_page
from tenants import reports
from tenants.models import Membership, Tenant

RANGES = {"7d": 7, "30d": 30}
HEADINGS = {"day": "day", "model": "model", "api_key": "key", "end_user": "end user"}


def usage_today(tenant: Tenant) -> dict[str, Any]:
    """What the tenant used since midnight (UTC): the figures the spend block shows until
    prices turn them into money."""
    now = timezone.now()
    today = reports.usage_breakdown(
        tenant=tenant, since=reports.period_start("day", now), until=now, by="day"
    )
    row = today[0] if today else {"requests": 0, "tokens": 0, "unit_hours": 0.0}
    return {"requests": row["requests"], "tokens": row["tokens"], "unit_hours": row["unit_hours"]}


def _chart(days: list[dict[str, Any]], since: datetime, until: datetime) -> str:
    """Tokens and requests per day over the range, a day without requests at zero (a line
    needs two points, and a gap is a day of nothing, not a missing figure)."""
    by_day = {row["label"]: row for row in days}
    points: list[tuple[float, dict[str, Any]]] = []
    day = since
    while day < until:
        row = by_day.get(day.date().isoformat(), {"tokens": 0, "requests": 0})
        end = min(day + timedelta(days=1), until)  # today ends now
        points.append(((day.timestamp() + end.timestamp()) / 2, row))
        day += timedelta(days=1)
    return line_chart(
        [
            Series("tokens per day", "#2f6fb0", [(x, r["tokens"]) for x, r in points]),
            Series("requests per day", "#2f9e6e", [(x, r["requests"]) for x, r in points]),
        ],
        title="Tokens and requests per day",
        since=since.timestamp(),
        until=until.timestamp(),
    )


@portal_page()
def usage(request: HttpRequest, membership: Membership) -> HttpResponse:
    tenant = membership.tenant
    range_key = request.GET.get("range", "7d")
    days = RANGES.get(range_key, 7)
    until = timezone.now()
    since = reports.period_start("day", until - timedelta(days=days - 1))
    tables = {
        by: reports.usage_breakdown(tenant=tenant, since=since, until=until, by=by)
        for by in reports.BREAKDOWNS
    }
    sections = [(by, HEADINGS[by], rows) for by, rows in tables.items()]
    context = page_context(
        membership,
        "usage",
        sections=sections,
        chart=mark_safe(_chart(tables["day"], since, until)),
        ranges=RANGES,
        range_key=range_key if range_key in RANGES else "7d",
        since=since,
        today=usage_today(tenant),
    )
    return render(request, "portal/usage.html", context)
