from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import include, path
from django.views import defaults
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from api.urls import admin_api_urlpatterns, openai_urlpatterns
from config import health
from plumbing.errors import openai_error_body
from portal.urls import oidc_urlpatterns

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("", include("telemetry.exporter")),  # /metrics, /metrics/cluster (Prometheus)
    path("admin/", admin.site.urls),
    path("console/", include("console.urls")),
    path("portal/", include("portal.urls")),
    path("portal/", include(oidc_urlpatterns)),
    path("api/v1/", include(admin_api_urlpatterns)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("v1/", include(openai_urlpatterns)),
]


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """An unknown path: under /v1/, in OpenAI's shape (clients parse it, as OpenAI answers an
    unknown URL); elsewhere Django's page."""
    if request.path.startswith("/v1/"):
        message = f"Invalid URL ({request.method} {request.path})"
        body = openai_error_body(message, "invalid_request_error", "unknown_url")
        return JsonResponse(body, status=404)
    page: Any = defaults.page_not_found(request, exception or Exception())
    return page


handler404 = not_found
