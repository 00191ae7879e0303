"""Writes about tenants and keys. Keyword-only, validated, transactional, and each change an
audit event (`audit.services.audit_record`, by whoever `audit.context` says acts)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import ProtectedError, Q, QuerySet
from django.utils import timezone

from audit.services import audit_record, snapshot
from plumbing.change_marks import ChangeMark, cache_by_marks
from plumbing.errors import Conflict, InvalidApiKey
from plumbing.ttlcache import TtlCache
from protocol.classes import RequestClass
from tenants.keys import hash_key, new_key_material
from tenants.models import ApiKey, Tenant

# Fields an operator may change with tenant_update; slug is the tenant's identity.
TENANT_UPDATABLE_FIELDS = frozenset(
    {
        "name",
        "is_active",
        "weight",
        "quota_units",
        "burst_units",
        "allowed_classes",
        "allowed_models",
        "rpm_limit",
        "tpm_limit",
        "token_budget",
        "budget_period",
        "cache_group",
        "enabled_fields",
    }
)


@dataclass(frozen=True)
class IssuedKey:
    """A key just created: the only moment its raw value exists outside the client."""

    api_key: ApiKey
    raw_key: str


@transaction.atomic
def tenant_create(
    *,
    slug: str,
    name: str = "",
    is_active: bool = True,
    weight: float = 1.0,
    quota_units: int = 0,
    burst_units: int = 0,
    allowed_classes: list[str] | None = None,
    allowed_models: list[str] | None = None,
    rpm_limit: int | None = None,
    tpm_limit: int | None = None,
    token_budget: int | None = None,
    budget_period: str = "month",
    cache_group: str = "",
    enabled_fields: list[str] | None = None,
) -> Tenant:
    tenant = Tenant(
        slug=slug,
        name=name or slug,
        is_active=is_active,
        weight=weight,
        quota_units=quota_units,
        burst_units=burst_units,
        allowed_classes=(
            list(settings.GPUSHARE_DEFAULT_CLASSES) if allowed_classes is None else allowed_classes
        ),
        allowed_models=allowed_models or [],
        rpm_limit=rpm_limit,
        tpm_limit=tpm_limit,
        token_budget=token_budget,
        budget_period=budget_period,
        cache_group=cache_group,
        enabled_fields=enabled_fields or [],
    )
    tenant.full_clean()
    tenant.save()
    audit_record(action="tenant.create", instance=tenant, after=snapshot(tenant))
    return tenant


@transaction.atomic
def tenant_update(*, tenant: Tenant, **changes: Any) -> Tenant:
    unknown = set(changes) - TENANT_UPDATABLE_FIELDS
    if unknown:
        raise ValueError(f"Cannot update {', '.join(sorted(unknown))} of a tenant.")
    before = snapshot(tenant)
    for field, value in changes.items():
        setattr(tenant, field, value)
    tenant.full_clean()
    tenant.save()
    after = snapshot(tenant)
    if before != after:
        # Quotas and limits are a tenant's fields: a change of one is a `tenant.update` too.
        audit_record(action="tenant.update", instance=tenant, before=before, after=after)
    _live_keys.clear()  # cached keys carry their tenant's policy
    return tenant


def tenant_delete(*, tenant: Tenant) -> None:
    """Deletes a tenant and its keys. One with usage history (or a dedicated engine) is kept:
    the ledger is the record of what was used; deactivate the tenant instead."""
    before, pk = snapshot(tenant), str(tenant.pk)
    try:
        with transaction.atomic():
            tenant.delete()
            audit_record(action="tenant.delete", object_type="tenant", object_id=pk,
                         before=before)  # fmt: skip
    except ProtectedError:
        raise Conflict(
            f"Tenant '{tenant.slug}' has usage history or dedicated engines and cannot be "
            "deleted; deactivate it instead (is_active = false)."
        ) from None
    _live_keys.clear()


@transaction.atomic
def api_key_create(
    *,
    tenant: Tenant,
    name: str,
    default_class: str = "",
    expires_at: datetime | None = None,
    allowed_models: list[str] | None = None,
    rpm_limit: int | None = None,
    tpm_limit: int | None = None,
) -> IssuedKey:
    """A new key; its default class is `standard`, or the tenant's first allowed class
    when `standard` is not allowed, unless one is given. `expires_at`, `allowed_models` and
    the minute limits narrow what the key may do within its tenant's."""
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError({"expires_at": "A key's expiry must be in the future."})
    if not default_class:
        allowed = tenant.allowed_classes
        standard = RequestClass.STANDARD
        default_class = standard if tenant.allows_class(standard) or not allowed else allowed[0]
    material = new_key_material()
    api_key = ApiKey(
        tenant=tenant,
        name=name,
        prefix=material.prefix,
        hashed_key=material.hashed_key,
        default_class=default_class,
        expires_at=expires_at,
        allowed_models=allowed_models or [],
        rpm_limit=rpm_limit,
        tpm_limit=tpm_limit,
    )
    api_key.full_clean()
    if not tenant.allows_class(default_class):
        raise ValidationError(
            {"default_class": f"Tenant '{tenant.slug}' may not use class '{default_class}'."}
        )
    api_key.save()
    audit_record(action="apikey.create", instance=api_key, after=snapshot(api_key))
    return IssuedKey(api_key=api_key, raw_key=material.raw_key)


def api_key_revoke(*, api_key: ApiKey) -> ApiKey:
    """Revoke a key. Revoking twice keeps the first revocation time."""
    if api_key.revoked_at is None:
        with transaction.atomic():
            before = snapshot(api_key)
            api_key.revoked_at = timezone.now()
            api_key.save(update_fields=["revoked_at"])
            audit_record(action="apikey.revoke", instance=api_key, before=before,
                         after=snapshot(api_key))  # fmt: skip
    _live_keys.clear()
    return api_key


def api_keys_revoke(*, api_keys: QuerySet[ApiKey]) -> int:
    """Revokes the keys of `api_keys` not revoked yet, in one statement; how many it revoked."""
    with transaction.atomic():
        live = list(api_keys.filter(revoked_at__isnull=True).select_for_update())
        now = timezone.now()
        count = ApiKey.objects.filter(pk__in=[k.pk for k in live]).update(revoked_at=now)
        for api_key in live:
            before = snapshot(api_key)
            api_key.revoked_at = now
            audit_record(action="apikey.revoke", instance=api_key, before=before,
                         after=snapshot(api_key))  # fmt: skip
    # An update sends no signal: the caches of keys must hear of it all the same.
    tenant_changes().bump()
    _live_keys.clear()
    return count


def api_key_authenticate(*, raw_key: str) -> ApiKey:
    """The live key behind `raw_key`, with its tenant, or InvalidApiKey.

    One message for unknown, revoked and inactive alike: a caller learns nothing about
    which keys exist. An expired key says so (its holder knows it existed); its expiry is
    checked on every call, cached or not.
    """
    hashed = hash_key(raw_key)
    api_key = _live_keys.get_or_compute(hashed, lambda: _live_key(hashed))
    if api_key is None:
        raise InvalidApiKey("Incorrect API key provided, or the key has been revoked.")
    if api_key.is_expired(timezone.now()):
        raise InvalidApiKey("The API key has expired.", code="expired_api_key")
    _touch(api_key)
    return api_key


def tenant_changes() -> ChangeMark:
    """Counts saves and deletes of tenants' and keys' rows (tenants/signals.py; a bulk
    update bumps it itself): the version of the per-process caches of keys and policies."""
    return ChangeMark("tenants", recheck_s=settings.GPUSHARE_CHANGE_RECHECK_S)


# Live keys, so the request path does not ask the database each time. An entry is trusted
# for GPUSHARE_AUTH_CACHE_S; then it is read again only if a tenant or a key was saved since
# (one Redis read; every 5 s the web's loop read the key's row in a thread instead), and at
# least every GPUSHARE_CHANGE_RECHECK_S. A revocation or deactivation made in another
# process takes effect within GPUSHARE_AUTH_CACHE_S; in this process at once (the writes
# below clear it).
_live_keys: TtlCache[ApiKey | None] = cache_by_marks(settings.GPUSHARE_AUTH_CACHE_S, tenant_changes)


def _live_key(hashed: str) -> ApiKey | None:
    api_key = ApiKey.objects.select_related("tenant").filter(hashed_key=hashed).first()
    if api_key is None or api_key.is_revoked or not api_key.tenant.is_active:
        return None
    return api_key


def _touch(api_key: ApiKey) -> None:
    """Record use, at most once per interval, so the request path rarely writes."""
    now = timezone.now()
    stale = now - timedelta(seconds=settings.GPUSHARE_KEY_TOUCH_INTERVAL_S)
    if api_key.last_used_at is not None and api_key.last_used_at > stale:
        return
    ApiKey.objects.filter(pk=api_key.pk).filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lte=stale)
    ).update(last_used_at=now)
    api_key.last_used_at = now
