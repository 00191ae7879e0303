"""The API's URLs: the OpenAI-compatible `/v1/` (whose inference endpoints the ASGI app serves
itself, `api.inference`) and the staff's admin API under `/api/v1/`."""

from django.urls import path

# auth_schema: how the schema describes the API's credentials (drf-spectacular extensions,
# registered when imported).
from api import admin, audit, auth_schema, batches, billing, files, served_models, usage  # noqa: F401

openai_urlpatterns = [
    path("me", admin.WhoAmIApi.as_view(), name="v1-me"),
    path("usage", usage.OwnUsageApi.as_view(), name="v1-usage"),
    path("spend", billing.OwnSpendApi.as_view(), name="v1-spend"),
    path("models", served_models.ModelListApi.as_view(), name="v1-models"),
    path("models/<path:model>", served_models.ModelDetailApi.as_view(), name="v1-model"),
    path("files", files.FileListCreateApi.as_view(), name="v1-files"),
    path("files/<str:file_id>", files.FileDetailApi.as_view(), name="v1-file"),
    path("files/<str:file_id>/content", files.FileContentApi.as_view(), name="v1-file-content"),
    path("batches", batches.BatchListCreateApi.as_view(), name="v1-batches"),
    path("batches/<str:batch_id>", batches.BatchDetailApi.as_view(), name="v1-batch"),
    path("batches/<str:batch_id>/cancel", batches.BatchCancelApi.as_view(), name="v1-batch-cancel"),
]

admin_api_urlpatterns = [
    path("tenants/", admin.TenantListCreateApi.as_view(), name="tenant-list"),
    path("tenants/<slug:slug>/", admin.TenantDetailApi.as_view(), name="tenant-detail"),
    path("tenants/<slug:slug>/quota/", admin.TenantQuotaApi.as_view(), name="tenant-quota"),
    path("tenants/<slug:slug>/keys/", admin.ApiKeyListCreateApi.as_view(), name="tenant-keys"),
    path(
        "tenants/<slug:slug>/keys/<int:key_id>/",
        admin.ApiKeyDetailApi.as_view(),
        name="tenant-key-detail",
    ),
    path(
        "tenants/<slug:slug>/keys/<int:key_id>/revoke/",
        admin.ApiKeyRevokeApi.as_view(),
        name="tenant-key-revoke",
    ),
    path("tenants/<slug:slug>/usage/", usage.UsageReportApi.as_view(), name="tenant-usage"),
    path(
        "tenants/<slug:slug>/usage/csv/", usage.UsageReportCsvApi.as_view(), name="tenant-usage-csv"
    ),
    path("tenants/<slug:slug>/spend/", billing.TenantSpendApi.as_view(), name="tenant-spend"),
    path("tenants/<slug:slug>/budget/", billing.TenantBudgetApi.as_view(), name="tenant-budget"),
    path(
        "tenants/<slug:slug>/keys/<int:key_id>/budget/",
        billing.KeyBudgetApi.as_view(),
        name="tenant-key-budget",
    ),
    path("prices/", billing.PriceListCreateApi.as_view(), name="price-list"),
    path("prices/<path:model>/", billing.PriceDetailApi.as_view(), name="price-detail"),
    path("audit/", audit.AuditApi.as_view(), name="audit"),
]
