"""`/metrics/cluster` and `/metrics` read back with prometheus-client's own parser, over the
real Redis and PostgreSQL: every documented metric on its page, its labels, units and
values, histogram buckets, rejections counted from the OpenAI API's error path, each
engine's seats by class and their bounds, and the cluster-wide series counted once however
many replicas serve them."""

from __future__ import annotations

import sys
import tomllib
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from capacity.units import UNIT_BYTES
from fairqueue.domain import EnginePolicy, TenantPolicy
from fairqueue.queue import LastWords
from plumbing.redis import redis_client
from scheduler.gpu_inventory import GpmActivity
from scheduler.pools.policies import fair_queue
from telemetry import gpus
from telemetry.exporter import BOUND_METRICS, CLUSTER_METRICS, PROCESS_METRICS
from telemetry.rejections import rejection_note
from telemetry.sampling import telemetry_sample
from tenants.models import Tenant, UsageRecord
from tenants.services import IssuedKey
from tests.asgi import asgi_request
from tests.telemetry.test_sampling import FakeNvml, StubEngine, make_engine, register, reserve

pytestmark = pytest.mark.django_db

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(client: Client | None = None, path: str = "/metrics/cluster", **headers: str) -> Samples:
    response = (client or Client()).get(path, headers=headers)
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
    activity = GpmActivity(sm_activity=0.5, tensor_activity=0.125)  # a GPU with GPM
    monkeypatch.setattr(gpus, "gpm_activity", lambda handles, window_s: [activity] * len(handles))
    engine = make_engine(stub_engine.port, kind="gpu")
    register(engine, kv_budget_units=4)
    reserve(engine, 1)  # acme holds 1 unit on the engine
    queue = fair_queue()
    queue.set_tenant_policy("acme", TenantPolicy(weight=1.0, quota_bytes=100 * UNIT_BYTES))
    queue.enqueue(tenant="acme", pool="m", request_class="interactive", prompt_tokens=1,
                  max_tokens=1, kv_bytes=UNIT_BYTES)  # fmt: skip
    for wait_ms, ttft_ms, latency_ms, cached in ((10, 40, 300, 4), (2000, None, 6000, 0)):
        UsageRecord.objects.create(
            request_id=uuid.uuid4().hex, tenant=owner, model="m", request_class="standard",
            outcome="success", prompt_tokens=7, completion_tokens=3, cached_tokens=cached,
            queue_wait_ms=wait_ms, ttft_ms=ttft_ms, latency_ms=latency_ms,
            finished_at=datetime.now(tz=UTC),
        )  # fmt: skip
    rejection_note(authorization=f"Bearer {owner_key.raw_key}", reason="rate_limit_exceeded",
                   status=429, request_class="", endpoint="chat", at=1.79e9)  # fmt: skip
    telemetry_sample()
    stub_engine.values.update(ttft_count=4, ttft_sum=0.2)  # first tokens since the last tick
    telemetry_sample()
    return owner


def families(samples: Samples) -> set[str]:
    return {
        name.removesuffix("_total").removesuffix("_bucket").removesuffix("_count")
        .removesuffix("_sum")
        for name in samples
    }  # fmt: skip


def test_every_documented_metric_is_exposed_on_its_page_after_traffic(busy: Tenant):
    cluster, process = scrape(), scrape(path="/metrics")
    # No seat bound is set: the series of bounds have no samples (never zeros).
    assert families(cluster) == set(CLUSTER_METRICS) - set(BOUND_METRICS)
    assert families(process) == set(PROCESS_METRICS)
    assert all(name.startswith("gpushare_") for name in [*cluster, *process])


def bound_engine(seats: int = 8, **bounds: object) -> None:
    """eng-a (make_engine, register) with seat bounds, and no queue of its own."""
    fair_queue().set_engine_policy(
        EnginePolicy(
            engine_id="eng-a", pool="m", kv_budget_bytes=4 * UNIT_BYTES, max_num_seqs=seats,
            **bounds,  # type: ignore[arg-type]
        )
    )  # fmt: skip


def run_job(request_class: str, *, ttft_s: float | None = None) -> str:
    """A job of the class picked on eng-a, released with its time to first token when one is
    given; returns its id."""
    queue = fair_queue()
    queue.set_tenant_policy("acme", TenantPolicy(weight=1.0, quota_bytes=100 * UNIT_BYTES))
    queue.enqueue(tenant="acme", pool="m", request_class=request_class, prompt_tokens=1,
                  max_tokens=1, kv_bytes=UNIT_BYTES // 4)  # fmt: skip
    job = queue.pick("m", "eng-a")
    assert job is not None
    assert job.request_class == request_class
    if ttft_s is not None:
        assert queue.release(job.pool, job.job_id, 1, 1, last_words=LastWords(ttft_s=ttft_s))
    return job.job_id


def test_with_a_seat_bound_every_documented_metric_is_exposed(busy: Tenant):
    bound_engine(ttft_targets_s={"interactive": 0.5})
    run_job("interactive", ttft_s=0.2)  # busy's waiting interactive job, measured
    cluster = scrape()
    assert families(cluster) == set(CLUSTER_METRICS)


def test_seat_bounds_by_engine_and_class(redis_db, stub_engine: StubEngine):
    make_engine(stub_engine.port)
    bound_engine(4, ttft_targets_s={"interactive": 0.3}, fixed_seats_below={"standard": 3})
    # Two within the target keep the bound at all 4 seats; the last, 4x the target, cuts it
    # by 4 x 0.995 seats, to 1 (lua/lib.lua observe_ttft).
    for ttft_s in (0.1, 0.2, 1.2):
        run_job("interactive", ttft_s=ttft_s)
    run_job("offline")
    samples = scrape()

    def of(name: str, request_class: str) -> float:
        return value(samples, name, engine="eng-a", **{"class": request_class})

    assert of("gpushare_engine_ttft_target_seconds", "interactive") == 0.3
    assert of("gpushare_engine_ttft_p99_seconds", "interactive") == 1.2  # nearest rank of 3
    assert of("gpushare_engine_seats_below", "interactive") == 1
    assert of("gpushare_engine_seats_below_held", "interactive") == 1  # the offline job
    # standard has a fixed bound: no target, nothing measured.
    assert of("gpushare_engine_seats_below", "standard") == 3
    assert of("gpushare_engine_seats_below_held", "standard") == 1
    for name in ("gpushare_engine_ttft_target_seconds", "gpushare_engine_ttft_p99_seconds"):
        assert [ls for ls, _ in samples[name] if ls["class"] != "interactive"] == [], name
    # interactive's full bound holds both classes below it back.
    seats = {
        c: of("gpushare_engine_class_seats", c) for c in ("interactive", "standard", "offline")
    }
    assert seats == {"interactive": 4, "standard": 0, "offline": 1}
    held_back = {
        c: of("gpushare_engine_class_held_back", c) for c in ("interactive", "standard", "offline")
    }
    assert held_back == {"interactive": 0, "standard": 1, "offline": 1}


def test_an_engine_without_bounds_has_class_seats_and_no_bound_series(
    redis_db, stub_engine: StubEngine
):
    register(make_engine(stub_engine.port))
    run_job("standard")
    samples = scrape()
    assert not [name for name in samples if name in BOUND_METRICS]
    for request_class in ("interactive", "standard", "offline"):
        labels = {"engine": "eng-a", "class": request_class}
        assert value(samples, "gpushare_engine_class_seats", **labels) == 8
        assert value(samples, "gpushare_engine_class_held_back", **labels) == 0


def test_a_target_unmeasured_for_its_idle_time_has_no_bound_in_force(
    redis_db, stub_engine: StubEngine
):
    make_engine(stub_engine.port)
    bound_engine(4, ttft_targets_s={"interactive": 0.3})
    run_job("interactive", ttft_s=1.2)  # cuts the seats below to 1
    run_job("offline")
    queue = fair_queue()
    # Its controller last measured 31 s ago: past the idle time (30 s), its bound lapses.
    seconds, _ = queue.redis.time()
    queue.redis.hset(queue.keys.engine("m", "eng-a"), "sampled:interactive", repr(seconds - 31.0))
    samples = scrape()
    labels = {"engine": "eng-a", "class": "interactive"}
    assert value(samples, "gpushare_engine_ttft_target_seconds", **labels) == 0.3
    assert value(samples, "gpushare_engine_ttft_p99_seconds", **labels) == 1.2
    assert value(samples, "gpushare_engine_seats_below_held", **labels) == 1
    assert "gpushare_engine_seats_below" not in samples
    assert (
        value(samples, "gpushare_engine_class_held_back", engine="eng-a", **{"class": "offline"})
        == 0
    )


def test_names_carry_their_base_unit():
    for name, (kind, _) in {**CLUSTER_METRICS, **PROCESS_METRICS}.items():
        assert not name.endswith(("_units", "_ms", "_total")), name
        if kind == "histogram":
            assert name.endswith("_seconds"), name


def test_the_per_pod_page_is_the_build_of_the_process_that_answered(busy: Tenant, settings):
    from telemetry.exporter import build_labels

    build_labels.cache_clear()
    settings.GPUSHARE_BUILD_COMMIT = "0123abc"
    try:
        samples = scrape(path="/metrics")
    finally:
        build_labels.cache_clear()
    python = ".".join(str(part) for part in sys.version_info[:3])
    with (Path(__file__).resolve().parents[2] / "pyproject.toml").open("rb") as file:
        version = tomllib.load(file)["project"]["version"]
    assert samples == {
        "gpushare_build_info": [
            ({"version": version, "commit": "0123abc", "python": python}, 1.0),
        ]
    }


def test_two_replicas_scraped_as_designed_count_every_request_once(busy: Tenant):
    """What Prometheus holds with two web pods: each pod's /metrics (a target each) and
    /metrics/cluster through the Service (one target, answered by either pod). Sums over
    everything it holds count the ledger's requests and the reservations once, and the
    per-pod series once per pod."""
    pods = {"pod-a": Client(), "pod-b": Client()}
    held: list[tuple[str, dict[str, str], float]] = []
    for pod, client in pods.items():
        for name, rows in scrape(client, path="/metrics").items():
            held += [(name, {**labels, "instance": pod}, v) for labels, v in rows]
    answers = [scrape(client) for client in pods.values()]  # the Service picks either pod
    for name, rows in answers[0].items():
        held += [(name, {**labels, "instance": "web"}, v) for labels, v in rows]

    def total(name: str, **labels: str) -> float:
        return sum(
            v for n, ls, v in held if n == name and all(ls.get(k) == x for k, x in labels.items())
        )

    assert total("gpushare_requests_total", outcome="success") == 2  # the ledger's two rows
    assert total("gpushare_requests_total", outcome="rejected") == 1  # and the 429
    assert total("gpushare_tokens_total", kind="prompt") == 14
    assert total("gpushare_tenant_reserved_bytes", tenant="acme") == UNIT_BYTES
    assert total("gpushare_cluster_info") == 1
    assert total("gpushare_build_info") == 2  # one per pod: per-process, as it should be
    # Either pod answers the Service with the same values: they are read from shared state.
    moving = "gpushare_queue_oldest_wait_seconds"  # the clock moves between the two scrapes
    assert {n: r for n, r in answers[0].items() if n != moving} == {
        n: r for n, r in answers[1].items() if n != moving
    }


def test_queue_reservation_and_quota_carry_tenant_class_and_pool_labels_in_bytes(busy: Tenant):
    Tenant.objects.filter(pk=busy.pk).update(burst_units=3)
    samples = scrape()
    assert value(samples, "gpushare_queue_depth", tenant="acme", **{"class": "interactive"}) == 1
    assert value(samples, "gpushare_queue_running", tenant="acme", **{"class": "standard"}) == 1
    assert value(samples, "gpushare_tenant_reserved_bytes", tenant="acme") == UNIT_BYTES
    assert value(samples, "gpushare_tenant_quota_bytes", tenant="acme") == 8 * UNIT_BYTES
    assert value(samples, "gpushare_tenant_burst_bytes", tenant="acme") == 3 * UNIT_BYTES
    assert value(samples, "gpushare_engine_reserved_bytes", engine="eng-a") == UNIT_BYTES
    assert value(samples, "gpushare_engine_inflight", engine="eng-a") == 1


def test_each_active_tenant_has_its_weight(busy: Tenant, outsider: Tenant):
    """The dashboards draw each tenant's share of served tokens against its weight's share."""
    Tenant.objects.filter(pk=busy.pk).update(weight=3.0)
    Tenant.objects.filter(pk=outsider.pk).update(weight=0.5, is_active=False)
    samples = scrape()
    assert value(samples, "gpushare_tenant_weight", tenant="acme") == 3.0
    assert all(labels["tenant"] != "globex" for labels, _ in samples["gpushare_tenant_weight"])


def test_ledger_counters_and_histograms(busy: Tenant):
    samples = scrape()
    labels = {"tenant": "acme", "class": "standard", "model": "m"}
    assert value(samples, "gpushare_requests_total", outcome="success", **labels) == 2
    assert value(samples, "gpushare_tokens_total", kind="prompt", **labels) == 14
    assert value(samples, "gpushare_tokens_total", kind="completion", **labels) == 6
    # Of its 14 prompt tokens, 4 were in an engine's prefix cache.
    assert value(samples, "gpushare_cached_prompt_tokens_total", **labels) == 4
    assert value(samples, "gpushare_prefix_cache_hit_ratio", tenant="acme") == pytest.approx(4 / 14)
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
    # Only the row that got a first token is observed: 40 ms.
    ttft = "gpushare_time_to_first_token_seconds"
    assert value(samples, f"{ttft}_count", **labels) == 1
    assert value(samples, f"{ttft}_sum", **labels) == pytest.approx(0.04)
    assert value(samples, f"{ttft}_bucket", le="0.05", **labels) == 1
    assert value(samples, f"{ttft}_bucket", le="+Inf", **labels) == 1


def test_histograms_have_every_bucket_ascending_and_cumulative(busy: Tenant):
    from telemetry.ledger import LATENCY_BUCKETS_S, TTFT_BUCKETS_S, WAIT_BUCKETS_S

    samples = scrape()
    labels = {"tenant": "acme", "class": "standard", "model": "m"}
    for name, bounds in (
        ("gpushare_admission_wait_seconds", WAIT_BUCKETS_S),
        ("gpushare_time_to_first_token_seconds", TTFT_BUCKETS_S),
        ("gpushare_request_latency_seconds", LATENCY_BUCKETS_S),
    ):
        rows = [(ls["le"], v) for ls, v in samples[f"{name}_bucket"]
                if all(ls.get(k) == x for k, x in labels.items())]  # fmt: skip
        assert [le for le, _ in rows] == [*(repr(b) for b in bounds), "+Inf"], name
        counts = [v for _, v in rows]
        assert counts == sorted(counts), name
        assert counts[-1] == value(samples, f"{name}_count", **labels), name


def test_engine_and_gpu_values_come_from_the_sampler(busy: Tenant):
    samples = scrape()
    engine = {"engine": "eng-a", "model": "m"}
    assert value(samples, "gpushare_engine_up", **engine) == 1
    assert value(samples, "gpushare_engine_kv_cache_usage_ratio", **engine) == 0.25
    # The GPU's utilization.gpu (0.55) is exported, not in the load: the reserved fraction is.
    assert value(samples, "gpushare_engine_load", **engine) == pytest.approx(0.25)
    assert value(samples, "gpushare_engine_seat_occupancy_ratio", **engine) == 2 / 32
    assert value(samples, "gpushare_engine_tensor_activity_ratio", **engine) == 0.125
    assert value(samples, "gpushare_gpu_sm_activity_ratio", gpu="0") == 0.5
    assert value(samples, "gpushare_engine_offline_inflight", engine="eng-a") == 0
    assert value(samples, "gpushare_engine_requests_running", **engine) == 2
    assert value(samples, "gpushare_gpu_utilization_ratio", gpu="0") == pytest.approx(0.55)
    assert value(samples, "gpushare_gpu_memory_total_bytes", gpu="0") == 80e9
    assert value(samples, "gpushare_gpu_temperature_celsius", gpu="0") == 61
    # TTFT is a histogram by tenant, class and model (from the ledger), not an engine's mean.
    assert "gpushare_engine_ttft_seconds" not in samples
    assert value(samples, "gpushare_rejections_total", tenant="acme", status="429") == 1


def test_without_a_gpu_the_gpu_metrics_have_no_samples(redis_db, stub_engine: StubEngine):
    register(make_engine(stub_engine.port))
    telemetry_sample()
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
    telemetry_sample()
    samples = scrape()
    assert value(samples, "gpushare_rejections_total", tenant="acme", status="404") == 1
    assert value(samples, "gpushare_rejections_total", tenant="", status="401") == 1
    assert value(samples, "gpushare_rejections_total", tenant="acme", reason="model_not_found") == 1
    rejected = UsageRecord.objects.get(tenant__slug="acme")
    assert (rejected.outcome, rejected.status_code, rejected.endpoint) == ("rejected", 404, "chat")


@pytest.mark.parametrize("page", ["/metrics", "/metrics/cluster"])
def test_without_a_token_only_this_machine_may_read_the_metrics(redis_db, settings, page):
    settings.GPUSHARE_METRICS_TOKEN = ""
    assert Client(REMOTE_ADDR="127.0.0.1").get(page).status_code == 200
    assert Client(REMOTE_ADDR="::1").get(page).status_code == 200
    refused = Client(REMOTE_ADDR="10.1.2.3").get(page)
    assert refused.status_code == 403
    assert b"GPUSHARE_METRICS_TOKEN" in refused.content


@pytest.mark.parametrize("page", ["/metrics", "/metrics/cluster"])
def test_a_metrics_token_when_set_is_required(redis_db, settings, page):
    settings.GPUSHARE_METRICS_TOKEN = "scrape-me"
    assert Client().get(page).status_code == 401
    assert Client().get(page, headers={"Authorization": "Bearer nope"}).status_code == 401
    scrape(path=page, Authorization="Bearer scrape-me")


def test_prompt_tokens_used_beyond_their_reservation_are_a_counter_by_tenant(busy: Tenant):
    from telemetry.rejections import UNRESERVED_KEY

    assert value(scrape(), "gpushare_unreserved_prompt_tokens_total", tenant="acme") == 0
    redis_client().hincrby(UNRESERVED_KEY, "acme", 6)
    assert value(scrape(), "gpushare_unreserved_prompt_tokens_total", tenant="acme") == 6


def test_engine_out_of_memory_deaths_are_a_counter_from_zero_by_engine_and_model(redis_db):
    from scheduler.engines.oom import engine_oom_note

    engine = make_engine(1)
    engine.status = "stopped"  # a stopped engine keeps its series: its deaths are history
    engine.save()
    assert value(scrape(), "gpushare_engine_oom_total", engine="eng-a", model="m") == 0
    engine_oom_note(engine="eng-a", model="m", run="4:1", cause="CUDA out of memory")
    engine_oom_note(engine="gone", model="m", run="5:1", cause="CUDA out of memory")
    samples = scrape()
    assert value(samples, "gpushare_engine_oom_total", engine="eng-a", model="m") == 1
    # The count of an engine no longer registered is not shown.
    assert [labels["engine"] for labels, _ in samples["gpushare_engine_oom_total"]] == ["eng-a"]
