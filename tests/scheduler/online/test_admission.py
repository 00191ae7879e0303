"""Admission (`online.admit`) with the database and the real Redis fair queue: it runs on the
event loop when the key, the route and the tenant's policy are cached, goes to a thread for
the step that must ask the database or refresh a cache entry, and a request whose enqueue
needs the queue taught again from the database is counted against its tenant's limits once,
not twice. (tests/scheduler/online/test_web_loop_never_blocks.py checks that nothing blocks the
loop meanwhile.)"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from protocol.inference import parse_inference_request
from scheduler.models import Device, Engine, EngineStatus
from scheduler.online import admission as online
from scheduler.pools.policies import fair_queue, sync_engine
from tenants.limits import RateLimited, tenant_slot
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
    return key_to_a_ready_engine(tmp_path)


def key_to_a_ready_engine(tmp_path: Path) -> str:
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


def admit(bearer: str, content: str = "hi") -> online.Admitted:
    request = parse_inference_request(
        "chat",
        {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 8},
    )
    return asyncio.run(online.admit(authorization=bearer, request=request, class_header=""))


class _Tokenizer(BaseHTTPRequestHandler):
    """An engine's /tokenize: answers `count`, and keeps each call's body."""

    calls: list[dict[str, Any]] = []
    count = 40

    def do_POST(self) -> None:
        _Tokenizer.calls.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        data = json.dumps({"count": _Tokenizer.count, "max_model_len": 2048}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def tokenizer(bearer, settings) -> Iterator[type[_Tokenizer]]:
    """The engine counts every prompt (none is short enough to be bounded), at this server."""
    settings.GPUSHARE_COUNT_PROMPTS_ABOVE_TOKENS = 1
    _Tokenizer.calls, _Tokenizer.count = [], 40
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Tokenizer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Engine.objects.filter(name="e1").update(port=server.server_address[1])
    yield _Tokenizer
    server.shutdown()
    server.server_close()


def tokens_counted(tenant: Tenant) -> int:
    """The tokens the tenant's limits hold against it, over every minute's counter."""
    client = fair_queue().redis
    return sum(int(client.get(k) or 0) for k in client.keys(f"{tenant_slot(tenant.pk)}tok:*"))


def queued_ids() -> list[str]:
    queue = fair_queue()
    ids = queue.redis.lrange(queue.keys.queue(MODEL, "standard", "acme"), 0, -1)
    return [i.decode() if isinstance(i, bytes) else i for i in ids]


def test_the_first_request_reads_the_database_in_a_thread_the_next_stay_on_the_loop(bearer, hops):
    first = admit(bearer)
    # Nothing cached yet: key, route, policy, the money budgets' hard stops.
    assert hops == ["_prepare", "_sync_policy", "_money_check"]
    hops.clear()
    second = admit(bearer)
    assert hops == []
    assert queued_ids() == [first.job.job_id, second.job.job_id]


def test_a_tenants_policy_that_ran_out_is_written_again_only_after_a_save(
    bearer, hops, monkeypatch
):
    """The policy's entry runs out: a thread reads its version (the change marks), and keeps
    it while no tenant, key or engine was saved (the policy is not written again); a save
    made elsewhere reaches the queue at the next run-out."""
    monkeypatch.setattr(online._synced_tenants, "ttl_s", 0.05)
    written: list[str] = []
    sync_tenant = online.sync_tenant

    def counted(tenant: Tenant, queue: Any) -> None:
        written.append(tenant.slug)
        sync_tenant(tenant, queue)

    monkeypatch.setattr(online, "sync_tenant", counted)
    admit(bearer)
    assert written == ["acme"]
    time.sleep(0.1)
    hops.clear()
    admit(bearer)
    assert hops == ["_sync_policy"]
    assert written == ["acme"]
    tenant = Tenant.objects.get(slug="acme")  # another process's save
    tenant.weight = 3
    tenant.save(update_fields=["weight"])
    time.sleep(0.1)
    hops.clear()
    admitted = admit(bearer)
    assert hops == ["_sync_policy"]
    assert written == ["acme", "acme"]
    assert admitted.job.job_id in queued_ids()
    queue = fair_queue()
    weight = queue.redis.hget(queue.keys.tenant(MODEL, "acme"), "weight")
    assert weight is not None
    assert float(weight) == 3.0


def test_a_tenant_over_its_rate_limit_never_makes_the_engine_count_its_prompt(bearer, tokenizer):
    tenant_update(tenant=Tenant.objects.get(slug="acme"), rpm_limit=1)
    admitted = admit(bearer, "a prompt the engine counts")
    assert admitted.job.prompt_tokens == 40  # the engine's count
    for _ in range(3):
        with pytest.raises(RateLimited):
            admit(bearer, "a prompt the engine counts")
    assert len(tokenizer.calls) == 1


def test_a_request_refused_after_it_was_counted_gives_its_tokens_back(bearer, tokenizer):
    tenant = tenant_update(tenant=Tenant.objects.get(slug="acme"), tpm_limit=100_000)
    tokenizer.count = 4000  # over the engine's 2,048: refused once counted
    with pytest.raises(online.ContextTooLong):
        admit(bearer, "a prompt the engine counts")
    assert len(tokenizer.calls) == 1
    assert tokens_counted(tenant) == 0
    tokenizer.count = 40
    admitted = admit(bearer, "a prompt the engine counts")
    # Counted for an upper bound before the engine counted it; settled when it ends.
    assert tokens_counted(tenant) >= admitted.job.prompt_tokens + admitted.job.max_tokens


def test_a_tenant_with_too_many_requests_waiting_is_told_to_retry(bearer, settings):
    settings.GPUSHARE_TENANT_MAX_WAITING = 2
    tenant = tenant_update(tenant=Tenant.objects.get(slug="acme"), tpm_limit=100_000)
    first, second = admit(bearer), admit(bearer)
    with pytest.raises(RateLimited) as refused:
        admit(bearer)
    assert "waiting" in refused.value.message
    assert refused.value.headers == {"Retry-After": "1"}
    assert queued_ids() == [first.job.job_id, second.job.job_id]
    assert tokens_counted(tenant) == 2 * (first.job.prompt_tokens + first.job.max_tokens)


def test_a_tenants_requests_reach_the_engine_with_its_groups_prefix_cache_salt(bearer):
    from scheduler.engines.calls import cache_salt, engine_body

    tenant = tenant_update(tenant=Tenant.objects.get(slug="acme"), cache_group="research")
    admitted = admit(bearer)
    assert admitted.call["cache_group"] == "research"
    salt = engine_body(admitted.call, "standard", 0.0)["cache_salt"]
    assert salt == cache_salt(tenant.pk, "research") != cache_salt(tenant.pk)


def test_a_step_that_must_ask_the_database_again_goes_to_a_thread(bearer, hops):
    admit(bearer)
    online._routes.clear()  # the route ran out: read again from the engines' rows
    hops.clear()
    admitted = admit(bearer)
    assert hops == ["_prepare"]
    assert admitted.job.job_id in queued_ids()


def test_a_request_whose_enqueue_resyncs_the_queue_is_counted_once(bearer, hops):
    tenant_update(tenant=TenantFactory.create(slug="acme"), rpm_limit=2)
    admit(bearer)  # counted once; the caches are warm now
    queue = fair_queue()
    queue.redis.delete(queue.keys.tenant(MODEL, "acme"))  # Redis lost the tenant's policy
    hops.clear()
    # Counted on the loop, refused by the queue, resynced from the database in a thread and
    # enqueued again: a second count would be the third of a limit of two, and refused.
    admitted = admit(bearer)
    assert hops == ["resync"]
    assert admitted.job.job_id in queued_ids()
    with pytest.raises(RateLimited):  # both were counted
        admit(bearer)


def test_a_budget_counter_redis_lost_is_seeded_from_the_ledger_in_a_thread(bearer, hops):
    from datetime import UTC, datetime

    from tenants.limits import BudgetExhausted
    from tenants.models import UsageRecord

    tenant = tenant_update(tenant=TenantFactory.create(slug="acme"), token_budget=150)
    admit(bearer)  # the caches are warm now; the budget's counter is seeded (90 tokens used)
    UsageRecord.objects.create(
        request_id="r1", tenant=tenant, model=MODEL, request_class="standard",
        outcome="success", prompt_tokens=30, completion_tokens=20,
        finished_at=datetime.now(tz=UTC),
    )  # fmt: skip
    queue = fair_queue()
    for key in queue.redis.keys("gs:limits:*:budget:*"):
        queue.redis.delete(key)  # Redis lost the counter: the ledger says 50 were used
    hops.clear()
    admit(bearer)  # 50 + 90 of 150
    assert hops == ["seed"]
    hops.clear()
    with pytest.raises(BudgetExhausted):  # 140 + 90
        admit(bearer)
    assert hops == []


def test_a_dispatch_loop_is_summoned_from_a_thread_and_not_waited_for(bearer, monkeypatch):
    import threading

    from scheduler import worker_tasks

    summoned, release = threading.Event(), threading.Event()
    calls: list[tuple[str, bool]] = []

    def dispatch(pool: str) -> None:
        try:
            asyncio.get_running_loop()
            on_a_loop = True
        except RuntimeError:
            on_a_loop = False
        calls.append((pool, on_a_loop))
        summoned.set()
        release.wait(5)  # a slow broker: the request does not wait for it

    monkeypatch.setattr(worker_tasks, "dispatch", dispatch)
    request = parse_inference_request(
        "chat", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    )

    async def admitted_before_the_message_is_sent() -> online.Admitted:
        admitted = await online.admit(authorization=bearer, request=request, class_header="")
        assert await asyncio.to_thread(summoned.wait, 5)
        assert online._background  # the message, still under way
        release.set()
        await online.background_done()
        return admitted

    admitted = asyncio.run(admitted_before_the_message_is_sent())
    assert calls == [(MODEL, False)]
    assert admitted.job.job_id in queued_ids()


def test_a_client_that_leaves_while_its_job_is_being_queued_leaves_no_job_behind(
    bearer, monkeypatch
):
    """The queue's reply is late and the client leaves before it comes: the job was queued
    all the same, and is cancelled once the reply is in."""
    from fairqueue.aio import AsyncFairQueue

    admit(bearer)  # warm: the next admission runs on the loop
    enqueue = AsyncFairQueue.enqueue_summoning
    job_ids: list[str] = []

    async def slow(self: AsyncFairQueue, **fields: Any) -> Any:
        job_ids.append(fields["job_id"])
        queued = await enqueue(self, **fields)
        await asyncio.sleep(0.2)  # a slow reply: the client leaves meanwhile
        return queued

    monkeypatch.setattr(AsyncFairQueue, "enqueue_summoning", slow)
    request = parse_inference_request(
        "chat", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    )

    async def leave() -> None:
        admitting = asyncio.ensure_future(
            online.admit(authorization=bearer, request=request, class_header="")
        )
        await asyncio.sleep(0.1)
        admitting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await admitting
        await online.background_done()

    asyncio.run(leave())
    job = fair_queue().get_job(MODEL, job_ids[0])
    assert job is not None
    assert job.state == "cancelled"
    assert job_ids[0] not in queued_ids()


def test_several_prompts_and_samples_are_reserved_as_that_many_sequences(bearer, tokenizer):
    from capacity.kvcost import kv_cost_bytes, kv_shape_from_config

    tenant = tenant_update(tenant=Tenant.objects.get(slug="acme"), tpm_limit=100_000)
    request = parse_inference_request(
        "completions",
        {"model": MODEL, "prompt": ["one prompt", "another", "a third"], "n": 2, "max_tokens": 8},
    )
    admitted = asyncio.run(online.admit(authorization=bearer, request=request, class_header=""))
    job = fair_queue().get_job(admitted.job.pool, admitted.job.job_id)
    assert job is not None
    # The engine counts each prompt: 40 tokens each, one call apiece.
    assert sorted(call["prompt"] for call in tokenizer.calls) == [
        "a third",
        "another",
        "one prompt",
    ]
    assert (job.prompt_tokens, job.seqs, job.max_tokens) == (3 * 40, 6, 6 * 8)
    per_token = kv_shape_from_config(MODEL_CONFIG).bytes_per_token
    one = kv_cost_bytes(bytes_per_token=per_token, prompt_tokens=40, max_tokens=8)
    assert job.kv_bytes == 2 * 3 * one
    # Counted for an upper bound first, at least what the request can use.
    assert tokens_counted(tenant) >= 3 * 40 + 6 * 8


def test_a_service_tier_chooses_the_class_among_those_the_tenant_may_send(bearer):
    def admitted_class(tier: str) -> str:
        request = parse_inference_request(
            "chat",
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
             "service_tier": tier},
        )  # fmt: skip
        admitted = asyncio.run(online.admit(authorization=bearer, request=request, class_header=""))
        assert "service_tier" not in admitted.call["body"]
        return admitted.job.request_class

    tenant = Tenant.objects.get(slug="acme")
    tenant_update(tenant=tenant, allowed_classes=["standard", "offline"])
    assert admitted_class("flex") == "offline"
    assert admitted_class("priority") == "standard"  # not allowed: the key's default
    assert admitted_class("default") == "standard"


def test_the_end_user_a_request_names_reaches_its_ledger_row_through_the_job(bearer):
    from workers.dispatch import usage_fields
    from workers.runner import RunResult

    request = parse_inference_request(
        "chat",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
         "user": "customer-42"},
    )  # fmt: skip
    admitted = asyncio.run(online.admit(authorization=bearer, request=request, class_header=""))
    job = fair_queue().get_job(admitted.job.pool, admitted.job.job_id)
    assert job is not None
    row = usage_fields(job, json.loads(job.payload), RunResult(outcome="success"))
    assert row["end_user"] == "customer-42"
