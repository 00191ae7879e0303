"""Ledger rows for billing's tests."""

from __future__ import annotations

import uuid
from datetime import datetime

from tenants.models import ApiKey, Tenant, UsageRecord


def charge(
    tenant: Tenant,
    at: datetime,
    *,
    model: str = "llama",
    prompt: int = 0,
    completion: int = 0,
    unit_seconds: float = 0.0,
    api_key: ApiKey | None = None,
    end_user: str = "",
    requests: int = 1,
) -> UsageRecord:
    return UsageRecord.objects.create(
        request_id=uuid.uuid4().hex,
        tenant=tenant,
        api_key=api_key,
        model=model,
        request_class="standard",
        end_user=end_user,
        outcome="success",
        prompt_tokens=prompt,
        completion_tokens=completion,
        reserved_unit_seconds=unit_seconds,
        requests=requests,
        finished_at=at,
    )
