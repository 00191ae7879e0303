"""A hard-stopped money budget at the web's admission (config.asgi): 429 insufficient_quota
in OpenAI's shape, before anything is queued, and a tenant under its budget still served."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from billing.alerts import budgets_check
from billing.services import budget_set, price_set
from billing.stops import clear_cache, money_admit
from scheduler.pools.policies import fair_queue
from tenants.models import ApiKey, Tenant
from tests.api.test_inference_asgi import CHAT, answer_the_first_queued_job, error_of
from tests.asgi import asgi_request
from tests.billing.ledger import charge
from tests.scheduler.online.test_admission import MODEL, key_to_a_ready_engine

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def waiting() -> list[tuple[str, int]]:
    return [(row.tenant, row.waiting) for row in fair_queue().snapshot().queues]


@pytest.mark.django_db(transaction=True)
def test_a_tenant_over_its_hard_stopped_budget_is_refused_at_admission(redis_db, tmp_path):
    headers = {"Authorization": key_to_a_ready_engine(tmp_path)}
    tenant = Tenant.objects.get(slug="acme")
    key = ApiKey.objects.get(tenant=tenant)
    price_set(
        model=MODEL,
        input_per_million="100",
        effective_from=datetime.now(tz=UTC) - timedelta(days=2),
    )
    budget_set(tenant=tenant, amount="1", period="day", hard_stop=True)
    # Under the budget: served.
    answering = answer_the_first_queued_job({"object": "chat.completion", "choices": []})
    assert asgi_request("POST", CHAT, json=BODY, headers=headers).status_code == 200
    answering.join()
    # 20 000 tokens at 100 per million: 2 of 1.
    charge(
        tenant, datetime.now(tz=UTC) - timedelta(seconds=1), model=MODEL, prompt=20_000, api_key=key
    )
    budgets_check()
    # The web trusts its cache of stops for GPUSHARE_AUTH_CACHE_S: this test does not wait.
    clear_cache()
    queued_before = waiting()
    refused = asgi_request("POST", CHAT, json=BODY, headers=headers)
    assert refused.status_code == 429
    error = error_of(refused)
    assert (error["type"], error["code"]) == ("insufficient_quota", "insufficient_quota")
    assert "Spending budget" in error["message"]
    assert waiting() == queued_before  # nothing was queued
    # Raising the amount lifts the stop at the next check.
    budget_set(tenant=tenant, amount="10")
    budgets_check()
    clear_cache()
    money_admit(tenant_id=tenant.pk, api_key_id=key.pk)  # admitted again
