"""The console's URLs, under /console/ (staff only; every view checks it)."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path

from scheduler import views as scheduler_views
from tenants import views as tenant_views

app_name = "console"


def _coming(section: str, title: str, arrives_with: str) -> Callable[[HttpRequest], HttpResponse]:
    """A page whose data other issues provide: says so instead of showing nothing."""

    @staff_member_required
    def view(request: HttpRequest) -> HttpResponse:
        context = {"section": section, "title": title, "arrives_with": arrives_with}
        return render(request, "console/placeholder.html", context)

    return view


urlpatterns = [
    path(
        "",
        _coming(
            "overview",
            "Overview",
            "issue 8, second part (GPU unit grids, engines and queues, after issues 3 and 4)",
        ),
        name="overview",
    ),
    path("tenants/", tenant_views.tenant_list, name="tenants"),
    path("tenants/new/", tenant_views.tenant_create, name="tenant-create"),
    path("units/", tenant_views.units_preview, name="units-preview"),
    path("tenants/<slug:slug>/", tenant_views.tenant_detail, name="tenant"),
    path("tenants/<slug:slug>/edit/", tenant_views.tenant_edit, name="tenant-edit"),
    path("tenants/<slug:slug>/keys/", tenant_views.api_key_create, name="key-create"),
    path(
        "tenants/<slug:slug>/keys/<int:key_id>/revoke/",
        tenant_views.api_key_revoke,
        name="key-revoke",
    ),
    path(
        "engines/",
        _coming("engines", "Engines", "issue 8, second part (engines from issue 3)"),
        name="engines",
    ),
    path(
        "queues/",
        _coming("queues", "Queues", "issue 8, second part (the fair queue from issue 4)"),
        name="queues",
    ),
    path("batches/", _coming("batches", "Batches", "issue 6 (batch jobs)"), name="batches"),
    path(
        "reports/",
        _coming("reports", "Reports", "issue 7 (usage ledger and quota reports)"),
        name="reports",
    ),
    path("planner/", scheduler_views.planner, name="planner"),
]
