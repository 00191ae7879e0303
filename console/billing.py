"""The prices page (read only: prices change through `manage.py price` or the admin API) and
a tenant's spend this month by model, for its page. Computed by billing's selectors."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from billing import selectors as billing
from staff.access import console_permission
from staff.roles import Perm
from tenants import reports
from tenants.models import Tenant


@console_permission(Perm.VIEW)
def prices(request: HttpRequest) -> HttpResponse:
    context = {
        "section": "prices",
        "prices": billing.price_list(),
        "currency": billing.currency(),
        "budgets": billing.budget_list(),
    }
    return render(request, "console/billing/prices.html", context)


def tenant_spend(tenant: Tenant) -> dict[str, Any]:
    """This month's spend by model and in all, and the tenant's money budgets."""
    until = timezone.now()
    since = reports.period_start("month", until)
    rows = billing.spend(tenant, since, until, "model")
    return {
        "since": since,
        "rows": [r.as_dict() for r in rows],
        "total": billing.spend_total(tenant, since, until).as_dict(),
        "currency": billing.currency(),
        "budgets": billing.budget_list(tenant=tenant),
    }
