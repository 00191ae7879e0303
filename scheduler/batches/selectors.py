"""Reading batches: a tenant's own, or all of them for staff, with their line counts."""

from __future__ import annotations

from django.db.models import Count, Q, QuerySet

from plumbing.errors import NotFound
from scheduler.models import (
    Batch,
    LineState,
)
from tenants.models import Tenant


def _with_counts(batches: QuerySet[Batch]) -> QuerySet[Batch]:
    return batches.annotate(
        lines_total=Count("lines"),
        lines_completed=Count("lines", filter=Q(lines__state=LineState.SUCCEEDED)),
        lines_failed=Count(
            "lines",
            filter=Q(lines__state__in=(LineState.FAILED, LineState.EXPIRED, LineState.CANCELLED)),
        ),
    )


def batch_list(*, tenant: Tenant) -> QuerySet[Batch]:
    return _with_counts(Batch.objects.filter(tenant=tenant))


def batch_list_for_staff() -> QuerySet[Batch]:
    """Every tenant's batches, for operators (the admin), with their line counts."""
    return _with_counts(Batch.objects.select_related("tenant"))


def batch_get(*, tenant: Tenant, batch_id: str) -> Batch:
    batch = batch_list(tenant=tenant).filter(public_id=batch_id).first()
    if batch is None:
        raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
    return batch
