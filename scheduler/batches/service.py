"""The OpenAI Batch API's writes: create a batch from an uploaded JSONL file (its checks in
`scheduler.batches.validation`) and cancel one. The feeder (`scheduler.batches.feeder`) runs
them as offline work.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from billing.stops import money_admit
from plumbing.errors import DomainError, Forbidden
from protocol.classes import RequestClass
from scheduler.batches.feeder import kick, stop_batch, stop_queued_lines
from scheduler.batches.files import file_get
from scheduler.batches.selectors import batch_get
from scheduler.batches.validation import ENDPOINTS_BY_PATH, check_metadata
from scheduler.models import (
    ACTIVE_BATCH_STATUSES,
    Batch,
    BatchStatus,
    BatchStop,
    FilePurpose,
)
from scheduler.pools.policies import fair_queue
from tenants.limits import BudgetExhausted
from tenants.models import ApiKey, Tenant, UsageRecord

COMPLETION_WINDOWS = ("24h",)


class TooManyBatches(DomainError):
    http_status = 429
    error_type = "requests"
    code = "too_many_active_batches"


class BatchNotCancellable(DomainError):
    http_status = 409
    code = "batch_not_cancellable"


def tokens_used_this_period(tenant: Tenant, now: datetime) -> int:
    from tenants.limits import budget_period_start

    since = budget_period_start(tenant.budget_period, now)
    used = UsageRecord.objects.filter(tenant=tenant, finished_at__gte=since).aggregate(
        tokens=Sum("prompt_tokens") + Sum("completion_tokens")
    )["tokens"]
    return int(used or 0)


def batch_create(
    *,
    tenant: Tenant,
    api_key: ApiKey | None,
    input_file_id: str,
    endpoint: str,
    completion_window: str,
    metadata: Any = None,
) -> Batch:
    """Accepts a batch (status `validating`); the file is checked by a worker."""
    if endpoint not in ENDPOINTS_BY_PATH:
        raise DomainError(
            f"Unsupported endpoint {endpoint!r}; use one of {', '.join(ENDPOINTS_BY_PATH)}.",
            param="endpoint",
        )
    if completion_window not in COMPLETION_WINDOWS:
        raise DomainError("'completion_window' must be 24h.", param="completion_window")
    metadata = check_metadata(metadata)
    stored = file_get(tenant=tenant, file_id=input_file_id)
    if stored.purpose != FilePurpose.BATCH:
        raise DomainError("The input file's purpose must be 'batch'.", param="input_file_id")
    if not tenant.allows_class(RequestClass.OFFLINE):
        raise Forbidden(
            f"Tenant '{tenant.slug}' may not send offline (batch) work.", code="class_not_allowed"
        )
    now = timezone.now()
    if tenant.token_budget and tokens_used_this_period(tenant, now) >= tenant.token_budget:
        raise BudgetExhausted(
            f"Token budget of {tenant.token_budget} per {tenant.budget_period} is used up; "
            "the batch cannot start."
        )
    money_admit(tenant_id=tenant.pk, api_key_id=api_key.pk if api_key is not None else None)
    with transaction.atomic():
        # The tenant's row, locked, makes its concurrent creates count one after another.
        list(Tenant.objects.select_for_update().filter(pk=tenant.pk).values_list("pk"))
        active = Batch.objects.filter(tenant=tenant, status__in=ACTIVE_BATCH_STATUSES).count()
        if active >= settings.GPUSHARE_TENANT_MAX_ACTIVE_BATCHES:
            raise TooManyBatches(
                f"The tenant has {active} active batches, the most it may; wait for one to "
                "finish or cancel one.",
                param="input_file_id",
            )
        batch = Batch.objects.create(
            public_id=f"batch_{uuid.uuid4().hex}",
            tenant=tenant,
            api_key=api_key,
            endpoint=endpoint,
            input_file_id=stored.public_id,
            completion_window=completion_window,
            metadata=metadata,
            expires_at=now + timedelta(seconds=settings.GPUSHARE_BATCH_COMPLETION_WINDOW_S),
        )
    transaction.on_commit(lambda: kick(batch.pk))
    return batch


def batch_cancel(*, batch: Batch) -> Batch:
    """Stops admitting the batch's lines; running ones finish, then it is `cancelled`."""
    with transaction.atomic():
        locked = Batch.objects.select_for_update().get(pk=batch.pk)
        if locked.status == BatchStatus.VALIDATING:
            now = timezone.now()
            locked.status, locked.cancelling_at, locked.cancelled_at = (
                BatchStatus.CANCELLED,
                now,
                now,
            )
            locked.stop_reason = BatchStop.CANCELLED
            locked.save()
        elif locked.status == BatchStatus.IN_PROGRESS:
            now = timezone.now()
            stop_batch(locked, BatchStop.CANCELLED, now)
            stop_queued_lines(locked, fair_queue(), now)
        elif locked.status not in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
            raise BatchNotCancellable(
                f"Cannot cancel a batch with status {locked.status}.", param="batch_id"
            )
    transaction.on_commit(lambda: kick(batch.pk))
    return batch_get(tenant=batch.tenant, batch_id=batch.public_id)
