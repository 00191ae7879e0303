"""The tenant's home page: its quota, burst, limits and classes, and what is in use now
(KV units reserved, tokens of the budget's period, active batches)."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from capacity.units import bytes_to_units_exact
from portal.access import page_context, portal_page
from scheduler.batches.selectors import batch_list
from scheduler.batches.service import tokens_used_this_period
from scheduler.models import ACTIVE_BATCH_STATUSES
from scheduler.pools.policies import fair_queue
from tenants.models import Membership


@portal_page()
def overview(request: HttpRequest, membership: Membership) -> HttpResponse:
    tenant = membership.tenant
    reserved = fair_queue().snapshot().tenant_reserved_bytes.get(tenant.slug, 0)
    context = page_context(
        membership,
        "overview",
        reserved_units=bytes_to_units_exact(reserved),
        budget_used=tokens_used_this_period(tenant, timezone.now()),
        active_batches=batch_list(tenant=tenant).filter(status__in=ACTIVE_BATCH_STATUSES).count(),
        max_active_batches=settings.GPUSHARE_TENANT_MAX_ACTIVE_BATCHES,
    )
    return render(request, "portal/overview.html", context)
