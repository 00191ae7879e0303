"""Authentication of tenant API keys (`Authorization: Bearer gs-...`) for the OpenAI API."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from plumbing.errors import InvalidApiKey, openai_exception_handler
from tenants.models import ApiKey, Tenant
from tenants.services import api_key_authenticate


@dataclass(frozen=True)
class TenantPrincipal:
    """The caller of the OpenAI API: a tenant, through one of its keys. Not a Django user."""

    tenant: Tenant
    api_key: ApiKey
    is_authenticated: bool = True


def authenticate_bearer(authorization: str) -> ApiKey:
    """The live key of an `Authorization: Bearer gs-...` header, or InvalidApiKey."""
    parts = authorization.split()
    if len(parts) != 2 or parts[0].lower() != "bearer":
        raise InvalidApiKey(
            "You didn't provide an API key. Send it as 'Authorization: Bearer gs-...'."
        )
    return api_key_authenticate(raw_key=parts[1])


class ApiKeyAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[TenantPrincipal, ApiKey]:
        api_key = authenticate_bearer(get_authorization_header(request).decode("latin-1"))
        return TenantPrincipal(tenant=api_key.tenant, api_key=api_key), api_key

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


class TenantApiView(APIView):
    """Base of every OpenAI-compatible view: a tenant key in, OpenAI-shaped errors out."""

    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [IsAuthenticated]

    def get_exception_handler(self) -> Callable[[Exception, dict[str, Any]], Response | None]:
        return openai_exception_handler

    @property
    def principal(self) -> TenantPrincipal:
        principal = self.request.user
        assert isinstance(principal, TenantPrincipal)  # guaranteed by ApiKeyAuthentication
        return principal
