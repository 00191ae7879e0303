"""The admin API's tokens: minted (shown once), looked up by their digest, revoked."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from staff.models import AdminToken

TOKEN_PREFIX = "gsa-"
# 32 random bytes in URL-safe base64: 43 characters, 256 bits.
_SECRET_BYTES = 32
# Characters of a token kept in clear to recognise it in lists ("gsa-AbCdEfGh").
DISPLAY_PREFIX_LENGTH = 12
# last_used_at is written at most this often: a script's burst of calls writes one row.
_LAST_USED_EVERY = timedelta(minutes=1)


@dataclass(frozen=True)
class IssuedToken:
    token: AdminToken
    raw_token: str  # shown once, never stored


def hash_token(raw_token: str) -> str:
    return hashlib.sha256(raw_token.encode("utf-8")).hexdigest()


def admin_token_create(*, user: Any, name: str = "default") -> IssuedToken:
    raw = f"{TOKEN_PREFIX}{secrets.token_urlsafe(_SECRET_BYTES)}"
    token = AdminToken.objects.create(
        user=user, name=name, prefix=raw[:DISPLAY_PREFIX_LENGTH], hashed_key=hash_token(raw)
    )
    return IssuedToken(token=token, raw_token=raw)


def admin_token_authenticate(*, raw_token: str) -> AdminToken | None:
    """The live token whose digest this is, of an active user; None for any other."""
    found = (
        AdminToken.objects.select_related("user")
        .filter(hashed_key=hash_token(raw_token), revoked_at__isnull=True)
        .first()
    )
    if found is None or not found.user.is_active:
        return None
    now = timezone.now()
    if found.last_used_at is None or now - found.last_used_at >= _LAST_USED_EVERY:
        AdminToken.objects.filter(pk=found.pk).update(last_used_at=now)
        found.last_used_at = now
    return found


def admin_token_revoke(*, token: AdminToken) -> AdminToken:
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token


def admin_token_list(*, user: Any = None) -> QuerySet[AdminToken]:
    tokens = AdminToken.objects.select_related("user")
    return tokens.filter(user=user) if user is not None else tokens.all()
