"""Reads. Anything that belongs to a tenant is looked up through that tenant."""

from __future__ import annotations

from django.db.models import Count, Q, QuerySet

from plumbing.errors import NotFound
from tenants.models import ApiKey, Tenant, UsageRecord


def tenant_list(*, is_active: bool | None = None) -> QuerySet[Tenant]:
    tenants = Tenant.objects.all()
    if is_active is not None:
        tenants = tenants.filter(is_active=is_active)
    return tenants


def tenant_get(*, slug: str) -> Tenant:
    try:
        return Tenant.objects.get(slug=slug)
    except Tenant.DoesNotExist:
        raise NotFound(f"No tenant '{slug}'.") from None


def api_key_list(*, tenant: Tenant, include_revoked: bool = True) -> QuerySet[ApiKey]:
    keys = ApiKey.objects.filter(tenant=tenant)
    if not include_revoked:
        keys = keys.filter(revoked_at__isnull=True)
    return keys


def api_key_get(*, tenant: Tenant, key_id: int) -> ApiKey:
    """A key of this tenant. Another tenant's key id is 'not found', never revealed."""
    try:
        return ApiKey.objects.get(tenant=tenant, pk=key_id)
    except ApiKey.DoesNotExist:
        raise NotFound(f"No API key {key_id} for tenant '{tenant.slug}'.") from None


def tenant_list_with_key_counts(*, is_active: bool | None = None) -> QuerySet[Tenant]:
    """`tenant_list` with `key_count` and `live_key_count` (not revoked), for the console."""
    # Counting groups the rows, and grouped queries drop Meta.ordering: order them again.
    return (
        tenant_list(is_active=is_active)
        .annotate(
            key_count=Count("api_keys"),
            live_key_count=Count("api_keys", filter=Q(api_keys__revoked_at__isnull=True)),
        )
        .order_by("slug")
    )


def usage_record_get(*, request_id: str) -> UsageRecord:
    """The ledger row of one request (its `X-Request-Id`), with its tenant and key."""
    try:
        return UsageRecord.objects.select_related("tenant", "api_key").get(request_id=request_id)
    except UsageRecord.DoesNotExist:
        raise NotFound(f"No request '{request_id}' in the usage ledger.") from None


def usage_record_find(*, tenant: Tenant, request_id: str) -> UsageRecord | None:
    """The tenant's ledger row of one request, or None (another tenant's is none too)."""
    return (
        UsageRecord.objects.select_related("api_key")
        .filter(tenant=tenant, request_id=request_id)
        .first()
    )
