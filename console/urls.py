"""The console's URLs, under /console/ (staff only; every view checks it)."""

from __future__ import annotations

from django.urls import path

from console import tenant_views
from console import views as scheduler_views

app_name = "console"

urlpatterns = [
    path("", scheduler_views.overview, name="overview"),
    path("live/overview/", scheduler_views.overview_live, name="overview-live"),
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
    path("engines/", scheduler_views.engine_list_page, name="engines"),
    path("engines/<slug:name>/", scheduler_views.engine_detail, name="engine"),
    path(
        "engines/<slug:name>/<str:action>/",
        scheduler_views.engine_action,
        name="engine-action",
    ),
    path("queues/", scheduler_views.queues, name="queues"),
    path("live/queues/", scheduler_views.queues_live, name="queues-live"),
    path("batches/", scheduler_views.batch_list_page, name="batches"),
    path("batches/<str:batch_id>/", scheduler_views.batch_detail, name="batch"),
    path("batches/<str:batch_id>/cancel/", scheduler_views.batch_cancel, name="batch-cancel"),
    path(
        "batches/<str:batch_id>/files/<str:file_id>/",
        scheduler_views.batch_file,
        name="batch-file",
    ),
    path("reports/", tenant_views.reports_view, name="reports"),
    path("requests/", tenant_views.request_lookup, name="request-lookup"),
    path("planner/", scheduler_views.planner, name="planner"),
]
