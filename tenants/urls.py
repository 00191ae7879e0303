from django.urls import path

from tenants import api, report_api

admin_api_urlpatterns = [
    path("tenants/", api.TenantListCreateApi.as_view(), name="tenant-list"),
    path("tenants/<slug:slug>/", api.TenantDetailApi.as_view(), name="tenant-detail"),
    path("tenants/<slug:slug>/quota/", api.TenantQuotaApi.as_view(), name="tenant-quota"),
    path("tenants/<slug:slug>/keys/", api.ApiKeyListCreateApi.as_view(), name="tenant-keys"),
    path(
        "tenants/<slug:slug>/keys/<int:key_id>/",
        api.ApiKeyDetailApi.as_view(),
        name="tenant-key-detail",
    ),
    path(
        "tenants/<slug:slug>/keys/<int:key_id>/revoke/",
        api.ApiKeyRevokeApi.as_view(),
        name="tenant-key-revoke",
    ),
    path("tenants/<slug:slug>/usage/", report_api.UsageReportApi.as_view(), name="tenant-usage"),
    path(
        "tenants/<slug:slug>/usage/csv/",
        report_api.UsageReportCsvApi.as_view(),
        name="tenant-usage-csv",
    ),
]

tenant_api_urlpatterns = [
    path("me", api.WhoAmIApi.as_view(), name="v1-me"),
    path("usage", report_api.OwnUsageApi.as_view(), name="v1-usage"),
]
