"""Admission (`online.admit`) with PostgreSQL and the real Redis fair queue: it runs on the
event loop when the key, the route and the tenant's policy are cached, goes to a thread for
the step that must ask the database, and a request handed to a thread half-way is counted
against its tenant's limits once, not twice."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from scheduler import online
from scheduler.inference import parse_inference_request
from scheduler.models import Device, Engine, EngineStatus
from scheduler.pools import fair_queue, sync_engine
from tenants.limits import RateLimited
from tenants.models import Tenant
from tenants.services import api_key_create, tenant_update
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)  # the thread must see the rows

MODEL = "tiny-llama"
MODEL_CONFIG = {
    "model_type": "llama", "hidden_size": 128, "num_attention_heads": 2,
    "num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 64, "dtype": "bfloat16",
}  # fmt: skip


@pytest.fixture
def bearer(redis_db, tmp_path) -> str:
    """The header of a key whose tenant may use a ready engine of MODEL (synced to the queue)."""
    (tmp_path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    device = Device.objects.create(
        node="n1", kind="cpu", index=0, name="cpu", memory_bytes=2**34, capacity_units=64
    )
    engine = Engine.objects.create(
        name="e1", model_path=str(tmp_path), served_model_name=MODEL, device=device,
        footprint_units=4, port=1, status=EngineStatus.READY, kv_capacity_tokens=10_000,
        max_num_seqs=32,
    )  # fmt: skip
    sync_engine(engine)
    tenant = TenantFactory.create(slug="acme", quota_units=16)
    return f"Bearer {api_key_create(tenant=tenant, name='k').raw_key}"


@pytest.fixture
def hops(monkeypatch) -> list[str]:
    """The names of the admission steps that went to a thread."""
    seen: list[str] = []
    to_thread = online._in_thread

    async def counted(work: Callable[..., Any], *args: Any) -> Any:
        seen.append(work.__name__)
        return await to_thread(work, *args)

    monkeypatch.setattr(online, "_in_thread", counted)
    return seen


def admit(bearer: str) -> online.Admitted:
    request = parse_inference_request(
        "chat", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    )
    return asyncio.run(online.admit(authorization=bearer, request=request, class_header=""))


def queued_ids() -> list[str]:
    queue = fair_queue()
    ids = queue.redis.lrange(queue.keys.queue(MODEL, "standard", "acme"), 0, -1)
    return [i.decode() if isinstance(i, bytes) else i for i in ids]


def test_the_first_request_reads_the_database_in_a_thread_the_next_stay_on_the_loop(bearer, hops):
    first = admit(bearer)
    assert hops == ["_prepare", "_enqueue"]  # nothing cached yet: key, route, policy
    hops.clear()
    second = admit(bearer)
    assert hops == []
    assert queued_ids() == [first.job.job_id, second.job.job_id]


def test_a_tenants_policy_that_ran_out_is_written_again_only_after_a_save(
    bearer, hops, monkeypatch
):
    """The policy's entry runs out, and is kept while no tenant, key or engine was saved
    (no trip to a thread); a save made elsewhere reaches the queue at the next run-out."""
    monkeypatch.setattr(online._synced_tenants, "ttl_s", 0.05)
    admit(bearer)
    time.sleep(0.1)
    hops.clear()
    admit(bearer)
    assert hops == []
    tenant = Tenant.objects.get(slug="acme")  # another process's save
    tenant.weight = 3
    tenant.save(update_fields=["weight"])
    time.sleep(0.1)
    admitted = admit(bearer)
    assert hops == ["_enqueue"]
    assert admitted.job.job_id in queued_ids()
    queue = fair_queue()
    weight = queue.redis.hget(queue.keys.tenant("acme"), "weight")
    assert weight is not None
    assert float(weight) == 3.0


def test_a_step_that_must_ask_the_database_again_goes_to_a_thread(bearer, hops):
    admit(bearer)
    online._routes.clear()  # the route ran out: read again from the engines' rows
    hops.clear()
    admitted = admit(bearer)
    assert hops == ["_prepare"]
    assert admitted.job.job_id in queued_ids()


def test_a_request_handed_to_a_thread_after_the_limits_counted_it_is_counted_once(bearer, hops):
    tenant_update(tenant=TenantFactory.create(slug="acme"), rpm_limit=2)
    admit(bearer)  # counted once; the caches are warm now
    queue = fair_queue()
    queue.redis.delete(queue.keys.tenant("acme"))  # Redis lost the tenant's policy
    hops.clear()
    # Counted on the loop, refused by the queue, resynced from the database in a thread: a
    # second count there would be the third of a limit of two, and refused.
    admitted = admit(bearer)
    assert hops == ["_enqueue"]
    assert admitted.job.job_id in queued_ids()
    with pytest.raises(RateLimited):  # both were counted
        admit(bearer)
