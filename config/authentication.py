"""Authentication of staff for the admin API. Loaded by DRF's settings: keep imports light."""

from __future__ import annotations

from typing import Any

from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request


class StaffBearerTokenAuthentication(BaseAuthentication):
    """A staff user's admin API token (staff.models.AdminToken), sent as
    `Authorization: Bearer <token>` or `Authorization: Token <token>`. The database holds the
    token's SHA-256 only; the lookup is by that digest."""

    keywords = ("bearer", "token")

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].decode("latin-1").lower() not in self.keywords:
            return None
        if len(parts) != 2:
            raise AuthenticationFailed("Invalid token header: one token after the keyword.")
        try:
            raw = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise AuthenticationFailed("Invalid token.") from None
        from staff.tokens import (
            admin_token_authenticate,  # DRF's settings may load this module before the apps
        )

        token = admin_token_authenticate(raw_token=raw)
        if token is None:
            raise AuthenticationFailed("Invalid or revoked token.")
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"
