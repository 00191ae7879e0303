"""A hard-stopped money budget refuses a tenant's new batch, and stops one being fed."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from billing.alerts import budgets_check
from billing.services import budget_set, price_set
from billing.stops import MoneyBudgetExhausted
from scheduler.batches.files import file_create
from scheduler.batches.service import batch_create
from scheduler.models import FilePurpose
from tenants.models import Tenant
from tests.billing.ledger import charge


@pytest.fixture
def stopped(owner: Tenant, redis_db) -> Tenant:
    price_set(
        model="llama", input_per_million="10", effective_from=datetime(2026, 1, 1, tzinfo=UTC)
    )
    budget_set(tenant=owner, amount="1", hard_stop=True)
    charge(owner, datetime.now(tz=UTC), prompt=200_000)
    budgets_check()
    return owner


def test_a_stopped_tenant_cannot_start_a_batch(stopped: Tenant, settings, tmp_path):
    settings.GPUSHARE_BATCH_FILES_DIR = tmp_path / "files"
    source = file_create(
        tenant=stopped, purpose=FilePurpose.BATCH, filename="in.jsonl", chunks=[b"{}\n"]
    )
    with pytest.raises(MoneyBudgetExhausted):
        batch_create(
            tenant=stopped,
            api_key=None,
            input_file_id=source.public_id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
