"""`/metrics` read back with prometheus-client's own parser, over the real Redis and
PostgreSQL: every documented metric, its labels and values, and rejections counted from the
OpenAI API's error path."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
import redis
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from config.metrics import METRICS
from config.redis import redis_client
from scheduler.fairqueue.domain import TenantPolicy
from scheduler.pools import fair_queue
from scheduler.units import UNIT_BYTES
from tenants.models import Tenant, UsageRecord
from tenants.services import IssuedKey
from tests.asgi import asgi_request
from tests.workers.test_telemetry import FakeNvml, StubEngine, make_engine, register, reserve
from workers.telemetry import rejection_note, telemetry_sample

pytestmark = pytest.mark.django_db

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(client: Client | None = None, **headers: str) -> Samples:
    response = (client or Client()).get("/metrics", headers=headers)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    matches = [
        v for ls, v in samples.get(name, []) if all(ls.get(k) == x for k, x in labels.items())
    ]
    assert len(matches) == 1, (name, labels, samples.get(name))
    return matches[0]


@pytest.fixture
def stub_engine():
    stub = StubEngine()
    yield stub
    stub.close()


@pytest.fixture
def busy(
    redis_db: redis.Redis,
    owner: Tenant,
    owner_key: IssuedKey,
    stub_engine: StubEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> Tenant:
    """A platform with traffic: a GPU, a ready engine with a reservation and a waiting job,
    finished requests in the ledger, a 429, and two sampler ticks."""
    FakeNvml([55]).install(monkeypatch)
    engine = make_engine(stub_engine.port, kind="gpu")
    register(engine, kv_budget_units=4)
    reserve(engine, 1)  # acme holds 1 unit on the engine
    queue = fair_queue()
    queue.set_tenant_policy("acme", TenantPolicy(weight=1.0, quota_bytes=100 * UNIT_BYTES))
    queue.enqueue(tenant="acme", pool="m", request_class="interactive", prompt_tokens=1,
                  max_tokens=1, kv_bytes=UNIT_BYTES)  # fmt: skip
    for wait_ms, latency_ms in ((10, 300), (2000, 6000)):
        UsageRecord.objects.create(
            request_id=uuid.uuid4().hex, tenant=owner, model="m", request_class="standard",
            outcome="success", prompt_tokens=7, completion_tokens=3, queue_wait_ms=wait_ms,
            latency_ms=latency_ms, finished_at=datetime.now(tz=UTC),
        )  # fmt: skip
    rejection_note(authorization=f"Bearer {owner_key.raw_key}", reason="rate_limit_exceeded",
                   status=429, request_class="", endpoint="chat", at=1.79e9)  # fmt: skip
    telemetry_sample(check_engines=False)
    stub_engine.values.update(ttft_count=4, ttft_sum=0.2)  # first tokens since the last tick
    telemetry_sample(check_engines=False)
    return owner


def test_every_documented_metric_is_exposed_after_traffic(busy: Tenant):
    samples = scrape()
    families = {name.removesuffix("_total").removesuffix("_bucket") for name in samples}
    missing = [name for name in METRICS if name not in families]
    assert not missing
    assert all(name.startswith("gpushare_") for name in samples)


def test_queue_reservation_and_quota_carry_tenant_class_and_pool_labels(busy: Tenant):
    samples = scrape()
    assert value(samples, "gpushare_queue_depth", tenant="acme", **{"class": "interactive"}) == 1
    assert value(samples, "gpushare_queue_running", tenant="acme", **{"class": "standard"}) == 1
    assert value(samples, "gpushare_tenant_reserved_units", tenant="acme") == 1.0
    assert value(samples, "gpushare_tenant_quota_units", tenant="acme") == 8
    assert value(samples, "gpushare_engine_reserved_units", engine="eng-a") == 1.0
    assert value(samples, "gpushare_engine_inflight", engine="eng-a") == 1


def test_ledger_counters_and_histograms(busy: Tenant):
    samples = scrape()
    labels = {"tenant": "acme", "class": "standard", "model": "m"}
    assert value(samples, "gpushare_requests_total", outcome="success", **labels) == 2
    assert value(samples, "gpushare_tokens_total", kind="prompt", **labels) == 14
    assert value(samples, "gpushare_tokens_total", kind="completion", **labels) == 6
    wait = "gpushare_admission_wait_seconds"
    assert value(samples, f"{wait}_count", **labels) == 2
    assert value(samples, f"{wait}_sum", **labels) == pytest.approx(2.01)
    assert value(samples, f"{wait}_bucket", le="0.01", **labels) == 1
    assert value(samples, f"{wait}_bucket", le="2.5", **labels) == 2
    assert value(samples, f"{wait}_bucket", le="+Inf", **labels) == 2
    latency = "gpushare_request_latency_seconds"
    assert value(samples, f"{latency}_bucket", le="0.5", **labels) == 1
    assert value(samples, f"{latency}_bucket", le="5.0", **labels) == 1
    assert value(samples, f"{latency}_bucket", le="10.0", **labels) == 2


def test_engine_and_gpu_values_come_from_the_sampler(busy: Tenant):
    samples = scrape()
    engine = {"engine": "eng-a", "model": "m"}
    assert value(samples, "gpushare_engine_up", **engine) == 1
    assert value(samples, "gpushare_engine_kv_cache_usage_ratio", **engine) == 0.25
    assert value(samples, "gpushare_engine_load", **engine) == pytest.approx(0.55)  # the GPU
    assert value(samples, "gpushare_engine_requests_running", **engine) == 2
    assert value(samples, "gpushare_gpu_utilization_ratio", gpu="0") == pytest.approx(0.55)
    assert value(samples, "gpushare_gpu_memory_total_bytes", gpu="0") == 80e9
    assert value(samples, "gpushare_gpu_temperature_celsius", gpu="0") == 61
    assert value(samples, "gpushare_engine_ttft_seconds", **engine) == pytest.approx(0.05)
    assert value(samples, "gpushare_rejections_total", tenant="acme", status="429") == 1


def test_without_a_gpu_the_gpu_metrics_have_no_samples(redis_db, stub_engine: StubEngine):
    register(make_engine(stub_engine.port))
    telemetry_sample(check_engines=False)
    samples = scrape()
    assert not [name for name in samples if name.startswith("gpushare_gpu_")]
    assert value(samples, "gpushare_engine_load", engine="eng-a") == 0.25


def test_an_engine_that_should_run_but_does_not_is_down(redis_db, stub_engine: StubEngine):
    engine = make_engine(stub_engine.port)
    engine.status = "failed"
    engine.save()
    assert value(scrape(), "gpushare_engine_up", engine="eng-a") == 0
    engine.status = "stopped"  # stopped on purpose: not down, not listed
    engine.save()
    assert "gpushare_engine_up" not in scrape()


@pytest.mark.django_db(transaction=True)  # admission reads the key in another thread
def test_refused_openai_requests_are_counted_by_tenant_reason_and_status(
    redis_db, owner_key: IssuedKey
):
    body = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
    bearer = {"Authorization": f"Bearer {owner_key.raw_key}"}
    response = asgi_request("POST", "/v1/chat/completions", json=body, headers=bearer)
    assert response.status_code == 404
    response = asgi_request("POST", "/v1/chat/completions", json=body,
                            headers={"Authorization": "Bearer gs-wrong"})  # fmt: skip
    assert response.status_code == 401
    telemetry_sample(check_engines=False)
    samples = scrape()
    assert value(samples, "gpushare_rejections_total", tenant="acme", status="404") == 1
    assert value(samples, "gpushare_rejections_total", tenant="", status="401") == 1
    assert value(samples, "gpushare_rejections_total", tenant="acme", reason="model_not_found") == 1
    rejected = UsageRecord.objects.get(tenant__slug="acme")
    assert (rejected.outcome, rejected.status_code, rejected.endpoint) == ("rejected", 404, "chat")


def test_without_a_token_only_this_machine_may_read_the_metrics(redis_db, settings):
    settings.GPUSHARE_METRICS_TOKEN = ""
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="::1").get("/metrics").status_code == 200
    refused = Client(REMOTE_ADDR="10.1.2.3").get("/metrics")
    assert refused.status_code == 403
    assert b"GPUSHARE_METRICS_TOKEN" in refused.content


def test_a_metrics_token_when_set_is_required(redis_db, settings):
    settings.GPUSHARE_METRICS_TOKEN = "scrape-me"
    assert Client().get("/metrics").status_code == 401
    assert Client().get("/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401
    scrape(Authorization="Bearer scrape-me")


def test_prompt_tokens_used_beyond_their_reservation_are_a_counter_by_tenant(busy: Tenant):
    from workers.telemetry import UNRESERVED_KEY

    assert value(scrape(), "gpushare_unreserved_prompt_tokens_total", tenant="acme") == 0
    redis_client().hincrby(UNRESERVED_KEY, "acme", 6)
    assert value(scrape(), "gpushare_unreserved_prompt_tokens_total", tenant="acme") == 6
