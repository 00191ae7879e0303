"""How the API schema (drf-spectacular) describes the platform's two kinds of credentials:
tenant API keys (`Authorization: Bearer gs-...`) and staff tokens (`Token ...` or
`Bearer ...`). Registered when imported (tenants.apps)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object


def bearer_scheme() -> dict[str, Any]:
    """The security scheme of a credential sent as `Authorization: Bearer ...`."""
    scheme: dict[str, Any] = build_bearer_security_scheme_object(
        header_name="Authorization", token_prefix="Bearer"
    )
    return scheme


class _BearerScheme(OpenApiAuthenticationExtension):
    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return bearer_scheme()


class TenantKeyScheme(_BearerScheme):
    target_class = "tenants.auth.ApiKeyAuthentication"
    name = "tenantKey"


class StaffBearerTokenScheme(_BearerScheme):
    # Sent as `Bearer <token>` (or `Token <token>`, the same token): described as a bearer.
    target_class = "config.authentication.StaffBearerTokenAuthentication"
    name = "staffBearerToken"
