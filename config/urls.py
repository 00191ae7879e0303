from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from config import health
from scheduler.urls import openai_urlpatterns
from tenants.urls import admin_api_urlpatterns, tenant_api_urlpatterns

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("", include("config.metrics")),  # /metrics (Prometheus)
    path("admin/", admin.site.urls),
    path("console/", include("config.console")),
    path("api/v1/", include(admin_api_urlpatterns)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("v1/", include(tenant_api_urlpatterns + openai_urlpatterns)),
]
