"""The console's URLs, under /console/ (staff only; every view checks it). One module per page."""

from __future__ import annotations

from django.urls import path

from console import (
    audit_log,
    batches,
    billing,
    engines,
    overview,
    planner,
    queues,
    reports,
    request_lookup,
    tenants,
)

app_name = "console"

urlpatterns = [
    path("", overview.overview, name="overview"),
    path("live/overview/", overview.overview_live, name="overview-live"),
    path("tenants/", tenants.tenant_list, name="tenants"),
    path("tenants/new/", tenants.tenant_create, name="tenant-create"),
    path("units/", tenants.units_preview, name="units-preview"),
    path("tenants/<slug:slug>/", tenants.tenant_detail, name="tenant"),
    path("tenants/<slug:slug>/edit/", tenants.tenant_edit, name="tenant-edit"),
    path("tenants/<slug:slug>/keys/", tenants.api_key_create, name="key-create"),
    path(
        "tenants/<slug:slug>/keys/<int:key_id>/revoke/",
        tenants.api_key_revoke,
        name="key-revoke",
    ),
    path("engines/", engines.engine_list_page, name="engines"),
    path("engines/<slug:name>/", engines.engine_detail, name="engine"),
    path("engines/<slug:name>/<str:action>/", engines.engine_action, name="engine-action"),
    path("queues/", queues.queues, name="queues"),
    path("live/queues/", queues.queues_live, name="queues-live"),
    path("batches/", batches.batch_list_page, name="batches"),
    path("batches/<str:batch_id>/", batches.batch_detail, name="batch"),
    path("batches/<str:batch_id>/cancel/", batches.batch_cancel, name="batch-cancel"),
    path("batches/<str:batch_id>/files/<str:file_id>/", batches.batch_file, name="batch-file"),
    path("reports/", reports.reports_view, name="reports"),
    path("requests/", request_lookup.request_lookup, name="request-lookup"),
    path("planner/", planner.planner, name="planner"),
    path("prices/", billing.prices, name="prices"),
    path("audit/", audit_log.audit_log, name="audit"),
]
