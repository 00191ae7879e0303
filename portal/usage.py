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


def usage_today(tenant: Tenant) -> dict[str, Any]:
    """What the tenant used since midnight (UTC): the figures the spend block shows until
    prices turn them into money."""
    now = timezone.now()
    today = reports.usage_breakdown(
        tenant=tenant, since=reports.period_start("day", now), until=now, by="day"
    )
    row = today[0] if today else {"requests": 0, "tokens": 0, "unit_hours": 0.0}
    return {"requests": row["requests"], "tokens": row["tokens"], "unit_hours": row["unit_hours"]}


def _chart(days: list[dict[str, Any]], since: float, until: float) -> str:
    def at(row: dict[str, Any]) -> float:
        return datetime.fromisoformat(row["label"] + "T12:00:00+00:00").timestamp()

    return line_chart(
        [
            Series("tokens per day", "#2f6fb0", [(at(r), r["tokens"]) for r in days]),
            Series("requests per day", "#2f9e6e", [(at(r), r["requests"]) for r in days]),
        ],
        title="Tokens and requests per day",
        since=since,
        until=until,
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
    context = page_context(
        membership,
        "usage",
        tables=tables,
        chart=mark_safe(_chart(tables["day"], since.timestamp(), until.timestamp())),
        ranges=RANGES,
        range_key=range_key if range_key in RANGES else "7d",
        since=since,
        today=usage_today(tenant),
    )
    return render(request, "portal/usage.html", context)
