"""The tenants' limits, checked both ways: `limits_admit` (sync) and `limits_admit_async`
(an event loop's, the budget's seed in a thread), with the real Redis and database."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from django.conf import settings
from redis.cluster import RedisCluster as PyRedisCluster
from redis.crc import key_slot

from plumbing.aio_redis import AsyncRedis
from plumbing.aio_redis_cluster import AsyncRedisCluster
from tenants.limits import (
    Admission,
    BudgetExhausted,
    RateLimited,
    Settlements,
    duration_text,
    limits_admit_async,
    limits_settle,
    limits_settle_async,
    tenant_slot,
)
from tenants.limits import limits_admit as limits_admit_sync
from tenants.models import UsageRecord
from tenants.services import api_key_create, tenant_update
from tests.support.redis_cluster import RedisCluster, running_cluster

pytestmark = pytest.mark.django_db(transaction=True)  # the async check's seed: in a thread

# A moment 30 s into a minute: the previous minute still overlaps the window by half.
NOW = 1_800_000_030.0

Admit = Callable[..., Admission]


@pytest.fixture(params=["sync", "on_a_loop"])
def limits_admit(request: pytest.FixtureRequest, seeds_in_threads: list[str]) -> Admit:
    """`limits_admit`, or `limits_admit_async` run on an event loop (same arguments)."""
    if request.param == "sync":
        return limits_admit_sync

    async def in_thread(work: Callable[[], None]) -> None:
        seeds_in_threads.append(work.__name__)
        await asyncio.to_thread(work)

    def on_a_loop(**kwargs: Any) -> Admission:
        async def check() -> Admission:
            client = AsyncRedis(settings.REDIS_URL, max_connections=1, read_timeout_s=5)
            try:
                return await limits_admit_async(**kwargs, client=client, in_thread=in_thread)
            finally:
                client.close()

        return asyncio.run(check())

    return on_a_loop


@pytest.fixture
def seeds_in_threads() -> list[str]:
    """The steps the async check handed to a thread."""
    return []


def test_it_refuses_the_request_over_the_rpm_limit_with_retry_after(owner, redis_db, limits_admit):
    tenant_update(tenant=owner, rpm_limit=3)
    for _ in range(3):
        limits_admit(tenant=owner, estimated_tokens=10, now=NOW)
    with pytest.raises(RateLimited) as caught:
        limits_admit(tenant=owner, estimated_tokens=10, now=NOW + 1)
    assert caught.value.http_status == 429
    assert caught.value.headers == {
        "Retry-After": "29", "x-ratelimit-limit-requests": "3",
        "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1m29s",
    }  # fmt: skip
    assert "3 requests per minute" in caught.value.message


def test_the_previous_minute_still_counts_in_the_sliding_window(owner, redis_db, limits_admit):
    tenant_update(tenant=owner, rpm_limit=4)
    for _ in range(4):
        limits_admit(tenant=owner, estimated_tokens=1, now=NOW)
    # 45 s later, the 4 requests of the previous minute weigh 4 x 0.75 = 3: one more fits.
    limits_admit(tenant=owner, estimated_tokens=1, now=NOW + 45)
    with pytest.raises(RateLimited):
        limits_admit(tenant=owner, estimated_tokens=1, now=NOW + 46)


def test_a_minute_counter_expires_three_minutes_after_its_first_count(
    owner, redis_db, limits_admit
):
    # The admission sets a counter's TTL where it creates the counter, not at each count.
    tenant_update(tenant=owner, rpm_limit=100, tpm_limit=10_000)
    limits_admit(tenant=owner, estimated_tokens=10, now=NOW)
    minute = int(NOW // 60)
    keys = [f"{tenant_slot(owner.pk)}{kind}:{minute}" for kind in ("req", "tok")]
    for key in keys:
        redis_db.expire(key, 100)  # as if 80 s had passed
    admission = limits_admit(tenant=owner, estimated_tokens=10, now=NOW + 1)
    limits_settle(admission=admission, used_tokens=4)
    assert [redis_db.get(key) for key in keys] == ["2", "14"]
    assert all(0 < redis_db.ttl(key) <= 100 for key in keys)
    limits_admit(tenant=owner, estimated_tokens=10, now=NOW + 60)  # the next minute's
    assert 170 < redis_db.ttl(f"{tenant_slot(owner.pk)}req:{minute + 1}") <= 180


def test_tpm_counts_the_estimate_and_settling_refunds_what_was_not_used(
    owner, redis_db, limits_admit
):
    tenant_update(tenant=owner, tpm_limit=1000)
    admission = limits_admit(tenant=owner, estimated_tokens=800, now=NOW)
    with pytest.raises(RateLimited, match="1000 tokens per minute"):
        limits_admit(tenant=owner, estimated_tokens=300, now=NOW + 1)
    limits_settle(admission=admission, used_tokens=100)
    limits_admit(tenant=owner, estimated_tokens=300, now=NOW + 2)


def test_settling_charges_what_was_used_beyond_the_estimate(owner, redis_db, limits_admit, caplog):
    tenant_update(tenant=owner, tpm_limit=1000, token_budget=5000, budget_period="day")
    admission = limits_admit(tenant=owner, estimated_tokens=10, now=NOW)
    # The prompt was far longer.
    limits_settle(admission=admission, used_tokens=900, request_id="job-9f")
    assert f"request job-9f of tenant {owner.pk} used 900 tokens, 890 more" in caplog.text
    with pytest.raises(RateLimited, match="1000 tokens per minute"):
        limits_admit(tenant=owner, estimated_tokens=200, now=NOW + 1)
    assert int(redis_db.get(admission.budget_key)) == 900


def test_other_tenants_are_not_limited_by_a_busy_one(owner, outsider, redis_db, limits_admit):
    tenant_update(tenant=owner, rpm_limit=1)
    tenant_update(tenant=outsider, rpm_limit=1)
    limits_admit(tenant=owner, estimated_tokens=1, now=NOW)
    limits_admit(tenant=outsider, estimated_tokens=1, now=NOW)
    with pytest.raises(RateLimited):
        limits_admit(tenant=owner, estimated_tokens=1, now=NOW)


def test_the_budget_survives_a_redis_restart_by_reading_the_ledger(
    owner, redis_db, limits_admit, seeds_in_threads
):
    tenant_update(tenant=owner, token_budget=1000, budget_period="day")
    UsageRecord.objects.create(
        request_id="r1", tenant=owner, model="m", request_class="standard", outcome="success",
        prompt_tokens=500, completion_tokens=400,
        finished_at=datetime.fromtimestamp(NOW - 60, tz=UTC),
    )  # fmt: skip
    redis_db.flushdb()  # Redis lost its counters
    limits_admit(tenant=owner, estimated_tokens=100, now=NOW)
    with pytest.raises(BudgetExhausted) as caught:
        limits_admit(tenant=owner, estimated_tokens=1, now=NOW)
    assert caught.value.error_type == "insufficient_quota"
    if limits_admit is not limits_admit_sync:
        assert seeds_in_threads == ["seed"]  # once: the counter was there the second time


def test_no_limits_means_no_refusals(owner, redis_db, limits_admit):
    for _ in range(50):
        limits_admit(tenant=owner, estimated_tokens=10_000, now=NOW)


def test_without_limits_nothing_is_counted_so_settling_refunds_nothing(
    owner, redis_db, limits_admit
):
    """No round trip to Redis at either end of the request: settling an uncounted admission
    leaves even a counter that happens to exist alone."""
    admission = limits_admit(tenant=owner, estimated_tokens=500, now=NOW)
    assert not admission.counted
    token_key = f"{tenant_slot(owner.pk)}tok:{admission.minute}"
    redis_db.set(token_key, 700)
    limits_settle(admission=admission, used_tokens=10)
    assert redis_db.get(token_key) == "700"


def test_an_admission_carries_what_the_minute_limits_leave_as_openai_headers(
    owner, redis_db, limits_admit
):
    tenant_update(tenant=owner, rpm_limit=3, tpm_limit=100)
    limits_admit(tenant=owner, estimated_tokens=10, now=NOW)
    admission = limits_admit(tenant=owner, estimated_tokens=25, now=NOW + 0.5)
    # This minute's requests weigh on the window until the end of the next minute: 89.5 s.
    assert admission.headers == {
        "x-ratelimit-limit-requests": "3", "x-ratelimit-remaining-requests": "1",
        "x-ratelimit-reset-requests": "1m29.5s", "x-ratelimit-limit-tokens": "100",
        "x-ratelimit-remaining-tokens": "65", "x-ratelimit-reset-tokens": "1m29.5s",
    }  # fmt: skip
    assert "headers" not in admission.settling_fields()
    assert Admission(**admission.settling_fields()) == admission


def test_a_used_up_budget_s_429_carries_the_minute_limits(owner, redis_db, limits_admit):
    tenant_update(tenant=owner, tpm_limit=1000, token_budget=100, budget_period="day")
    limits_admit(tenant=owner, estimated_tokens=90, now=NOW)
    # A minute later the 90 tokens weigh half, and the window is empty in 30 s; no rpm
    # limit, no requests headers.
    with pytest.raises(BudgetExhausted) as caught:
        limits_admit(tenant=owner, estimated_tokens=20, now=NOW + 60)
    assert caught.value.headers == {
        "x-ratelimit-limit-tokens": "1000", "x-ratelimit-remaining-tokens": "955",
        "x-ratelimit-reset-tokens": "30s",
    }  # fmt: skip


def test_a_tenant_without_minute_limits_gets_no_headers(owner, redis_db, limits_admit):
    assert limits_admit(tenant=owner, estimated_tokens=10, now=NOW).headers == {}
    tenant_update(tenant=owner, token_budget=1000, budget_period="day")
    budgeted = limits_admit(tenant=owner, estimated_tokens=10, now=NOW)
    assert budgeted.counted
    assert budgeted.headers == {}


@pytest.mark.parametrize(
    ("ms", "text"),
    [(0, "0s"), (-5, "0s"), (17, "17ms"), (999, "999ms"), (1000, "1s"), (59_500, "59.5s"),
     (8_640, "8.64s"), (60_000, "1m0s"), (360_000, "6m0s"), (89_501, "1m29.501s"),
     (3_600_000, "1h0m0s"), (3_723_000, "1h2m3s")],
)  # fmt: skip
def test_durations_are_written_as_openai_writes_its_resets(ms, text):
    assert duration_text(ms) == text


def test_a_keys_own_rpm_refuses_it_while_its_tenants_other_keys_go_on(
    owner, redis_db, limits_admit
):
    limited = api_key_create(tenant=owner, name="ci", rpm_limit=2).api_key
    other = api_key_create(tenant=owner, name="web").api_key
    for _ in range(2):
        limits_admit(tenant=owner, estimated_tokens=1, now=NOW, api_key=limited)
    with pytest.raises(RateLimited, match="this key reached: 2 requests per minute"):
        limits_admit(tenant=owner, estimated_tokens=1, now=NOW, api_key=limited)
    limits_admit(tenant=owner, estimated_tokens=1, now=NOW, api_key=other)


def test_a_keys_tpm_is_settled_to_the_tokens_used(owner, redis_db, limits_admit):
    key = api_key_create(tenant=owner, name="ci", tpm_limit=1000).api_key
    admission = limits_admit(tenant=owner, estimated_tokens=800, now=NOW, api_key=key)
    assert admission.api_key_id == key.pk
    with pytest.raises(RateLimited, match="this key reached: 1000 tokens per minute"):
        limits_admit(tenant=owner, estimated_tokens=300, now=NOW + 1, api_key=key)
    limits_settle(admission=admission, used_tokens=100)
    limits_admit(tenant=owner, estimated_tokens=300, now=NOW + 2, api_key=key)


def test_a_processs_settlements_are_summed_per_counter_and_written_at_its_flush(
    owner, outsider, redis_db
):
    # A worker's settlements (workers/dispatch.py): its minute counters keep the estimates
    # until its flush, which writes each counter once for all the requests it settles; a
    # budget is settled at once.
    tenant_update(tenant=owner, tpm_limit=10_000, token_budget=50_000, budget_period="day")
    tenant_update(tenant=outsider, tpm_limit=10_000)
    ours = [limits_admit_sync(tenant=owner, estimated_tokens=800, now=NOW + i) for i in range(3)]
    theirs = limits_admit_sync(tenant=outsider, estimated_tokens=500, now=NOW)
    settlements = Settlements()
    for admission in ours:
        settlements.add(admission=admission, used_tokens=100)
    settlements.add(admission=theirs, used_tokens=500)  # all it was counted for: no refund
    minute = int(NOW // 60)
    counters = [f"{tenant_slot(tenant.pk)}tok:{minute}" for tenant in (owner, outsider)]
    assert [redis_db.get(counter) for counter in counters] == ["2400", "500"]
    assert redis_db.get(ours[0].budget_key) == "300"  # at once
    assert settlements.pending
    assert settlements.flush() == 1  # one counter written, once, for its three requests
    assert [redis_db.get(counter) for counter in counters] == ["300", "500"]
    assert not settlements.pending
    assert settlements.flush() == 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    with running_cluster(tmp_path_factory.mktemp("cluster")) as started:
        yield started


def test_a_tenants_limits_are_counted_in_its_own_slot_of_a_cluster(
    owner, cluster: RedisCluster
) -> None:
    """Every key of one check is under the tenant's hash tag (`tenant_slot`): on a Redis
    Cluster of three primaries the check and the settle each run on the primary of that
    slot, the tenant's and its API key's counts together, and the limits hold there."""
    tenant_update(tenant=owner, rpm_limit=2, tpm_limit=1_000)
    key = api_key_create(tenant=owner, name="limited", rpm_limit=5).api_key

    async def in_thread(work: Callable[[], None]) -> None:
        raise AssertionError("no budget: nothing to seed")

    async def admit_twice_then_refused() -> tuple[list[Admission], RateLimited]:
        client: Any = AsyncRedisCluster(cluster.url, max_connections=2, read_timeout_s=5)

        async def admit(tokens: int, at: float) -> Admission:
            return await limits_admit_async(
                tenant=owner, estimated_tokens=tokens, now=at, api_key=key, client=client,
                in_thread=in_thread,
            )  # fmt: skip

        try:
            admitted = [await admit(300, NOW), await admit(300, NOW + 1)]
            await limits_settle_async(admission=admitted[0], used_tokens=100, client=client)
            with pytest.raises(RateLimited) as refused:
                await admit(1, NOW + 2)
            return admitted, refused.value
        finally:
            client.close()

    admitted, refused = asyncio.run(admit_twice_then_refused())
    assert all(admission.counted for admission in admitted)
    assert "requests per minute" in str(refused)
    nodes = PyRedisCluster.from_url(cluster.url, decode_responses=True)
    try:
        prefix = f"{tenant_slot(owner.pk)}"
        names = [f"{prefix}{owner_}{kind}:{admitted[0].minute}"
                 for owner_ in ("", f"key:{key.pk}:") for kind in ("req", "tok")]  # fmt: skip
        assert [nodes.get(name) for name in names] == ["2", "400", "2", "400"]
        assert len({key_slot(name.encode()) for name in names}) == 1
    finally:
        nodes.close()
