"""The usage page: the tenant's requests, tokens, reserved unit-hours and spend by day,
model, key and end user, from the usage ledger (`tenants.reports`) priced by the platform's
prices (`billing.selectors.spend`), with a chart; and its spending budgets with what this
period has used of them."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.safestring import mark_safe

from billing.selectors import GroupBy, budget_list, currency, spend, spend_total
from console.charts import Series, line_chart
from portal.access import page_context, portal_page
from tenants import reports
from tenants.models import Membership, Tenant

RANGES = {"7d": 7, "30d": 30}
HEADINGS = {"day": "day", "model": "model", "api_key": "key", "end_user": "end user"}


# The ledger's breakdowns, as billing groups spend.
SPEND_GROUPS: dict[str, GroupBy] = {
    "day": "day", "model": "model", "api_key": "key", "end_user": "end_user"
}  # fmt: skip


def usage_today(tenant: Tenant) -> dict[str, Any]:
    """What the tenant used and spent since midnight (UTC)."""
    now = timezone.now()
    since = reports.period_start("day", now)
    today = reports.usage_breakdown(tenant=tenant, since=since, until=now, by="day")
    row = today[0] if today else {"requests": 0, "tokens": 0, "unit_hours": 0.0}
    return {
        "requests": row["requests"],
        "tokens": row["tokens"],
        "unit_hours": row["unit_hours"],
        "spend": spend_total(tenant, since, now).money,
    }


def spend_by_label(tenant: Tenant, since: datetime, until: datetime, by: str) -> dict[str, Any]:
    """Spend per row of a usage breakdown, by the row's label (a key's label is its prefix
    and name, as `tenants.reports` writes it)."""
    rows = spend(tenant, since, until, group_by=SPEND_GROUPS[by])
    if by != "api_key":
        return {row.group or "": row.money for row in rows}
    labels = {f"{k.pk}:{k.name}": f"{k.prefix}… {k.name}" for k in tenant.api_keys.all()}
    labels["-"] = "(no key)"
    return {labels.get(row.group or "-", row.group or ""): row.money for row in rows}


def budgets(tenant: Tenant, now: datetime) -> list[dict[str, Any]]:
    """The tenant's spending budgets (its own and its keys'), each with this period's spend."""
    found = []
    for budget in budget_list(tenant=tenant):
        start = reports.period_start(budget.period, now)  # type: ignore[arg-type]
        spent = spend_total(tenant, start, now, api_key=budget.api_key).money
        found.append(
            {
                "budget": budget,
                "spent": spent,
                "percent": min(100, int(spent * 100 / budget.amount)) if budget.amount else 0,
            }
        )
    return found


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
    for by, rows in tables.items():
        money = spend_by_label(tenant, since, until, by)
        for row in rows:
            row["spend"] = money.get(row["label"] or "", 0)
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
        spent=spend_total(tenant, since, until).money,
        budgets=budgets(tenant, until),
        currency=currency(),
    )
    return render(request, "portal/usage.html", context)
