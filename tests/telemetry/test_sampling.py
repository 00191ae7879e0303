"""The samplers against the real PostgreSQL and Redis: GPUs with and without pynvml, engines'
/metrics from a stand-in HTTP server, the load written to the fair queue, rejections, the
ledger folded into counters, and history downsampled as it ages."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
import redis

from capacity.units import UNIT_BYTES
from fairqueue.domain import EnginePolicy, TenantPolicy
from scheduler.gpu_inventory import GpmActivity, node_name
from scheduler.models import Device, Engine
from scheduler.pools.policies import fair_queue
from telemetry import gpus, ledger, rejections
from telemetry import sampling as telemetry
from telemetry.engines import engine_live
from telemetry.gpus import gpu_live, read_gpus
from telemetry.history import telemetry_rollup
from telemetry.ledger import ledger_counters, ledger_fold
from telemetry.models import EngineSample, GpuSample, Resolution
from telemetry.rejections import (
    PENDING_REJECTIONS_KEY,
    rejection_counts,
    rejection_note,
    rejections_drain,
)
from telemetry.sampling import telemetry_sample
from tenants.models import Tenant, UsageRecord
from tenants.reports import tenant_usage_report
from tenants.services import IssuedKey

pytestmark = pytest.mark.django_db

VLLM_METRICS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="m"}} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{{engine="0",model_name="m"}} {preemptions}
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {ttft_count}
vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {ttft_count}
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {ttft_sum}
"""


class StubEngine:
    """An HTTP server answering /metrics (and /health) with what the test sets."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {
            "running": 2, "kv": 0.25, "preemptions": 0, "ttft_count": 0, "ttft_sum": 0.0,
        }  # fmt: skip
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = (
                    VLLM_METRICS.format(**stub.values).encode() if self.path == "/metrics" else b""
                )
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub_engine() -> Iterator[StubEngine]:
    stub = StubEngine()
    yield stub
    stub.close()


def make_engine(port: int, *, kind: str = "cpu", name: str = "eng-a") -> Engine:
    device = Device.objects.create(
        node=node_name(""), kind=kind, index=0, name=kind, memory_bytes=8 * UNIT_BYTES,
        capacity_units=8,
    )  # fmt: skip
    return Engine.objects.create(
        name=name, model_path="/nowhere", served_model_name="m", device=device,
        footprint_units=4, port=port, status="ready", kv_capacity_tokens=1000,
    )  # fmt: skip


def register(engine: Engine, *, kv_budget_units: int = 4) -> None:
    fair_queue().set_engine_policy(
        EnginePolicy(
            engine_id=engine.name,
            pool="m",
            kv_budget_bytes=kv_budget_units * UNIT_BYTES,
            max_num_seqs=8,
        )
    )


def reserve(engine: Engine, units: int) -> None:
    """A job picked on the engine: the fair queue holds its KV reservation."""
    queue = fair_queue()
    queue.set_tenant_policy("acme", TenantPolicy(weight=1.0, quota_bytes=100 * UNIT_BYTES))
    queue.enqueue(tenant="acme", pool="m", request_class="standard", prompt_tokens=1,
                  max_tokens=1, kv_bytes=units * UNIT_BYTES)  # fmt: skip
    assert queue.pick("m", engine.name) is not None


class FakeNvml:
    """pynvml's calls the sampler makes, answering for two GPUs; GPU 1 has no sensors."""

    def __init__(self, utilization: list[int]) -> None:
        self.utilization = utilization

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def fail(*args: Any) -> Any:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

        def temperature(handle: int, sensor: int) -> int:
            return 61 if handle == 0 else fail()

        def power(handle: int) -> int:
            return 250_500 if handle == 0 else fail()

        calls = {
            "nvmlInit": lambda: None,
            "nvmlShutdown": lambda: None,
            "nvmlDeviceGetCount": lambda: len(self.utilization),
            "nvmlDeviceGetHandleByIndex": lambda index: index,
            "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=self.utilization[h]),
            "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(
                used=(h + 1) * 10**9, total=80 * 10**9
            ),
            "nvmlDeviceGetTemperature": temperature,
            "nvmlDeviceGetPowerUsage": power,
            "nvmlGpmQueryDeviceSupport": fail,  # no GPM (before Hopper)
        }
        for name, call in calls.items():
            monkeypatch.setattr(pynvml, name, call)


@pytest.fixture
def live(redis_db: redis.Redis) -> redis.Redis:
    return redis_db


# --- GPUs -----------------------------------------------------------------------------------


def test_without_an_nvidia_driver_there_are_no_gpu_readings_at_all(live: redis.Redis):
    assert read_gpus() == []  # this machine has no NVIDIA driver: the real pynvml says so
    report = telemetry_sample()
    assert report.gpus == []
    assert not GpuSample.objects.exists()
    assert not live.keys("gs:telemetry:gpu*")


def test_with_pynvml_each_gpu_is_sampled_and_missing_sensors_stay_absent(
    live: redis.Redis, monkeypatch: pytest.MonkeyPatch
):
    FakeNvml([40, 90]).install(monkeypatch)
    telemetry_sample(now=1000.0)
    node = node_name("")
    first = gpu_live(live, node, 0)
    assert first["utilization_percent"] == 40
    assert first["temperature_c"] == 61
    assert first["power_w"] == pytest.approx(250.5)
    assert first["memory_used_bytes"] == 10**9
    assert first["memory_total_bytes"] == 80 * 10**9
    second = gpu_live(live, node, 1)
    assert "temperature_c" not in second
    assert "power_w" not in second
    rows = {row.gpu_index: row for row in GpuSample.objects.all()}
    assert rows[0].temperature_c == 61
    assert rows[1].temperature_c is None
    assert rows[1].power_w is None
    assert rows[1].utilization_percent == 90
    assert {row.resolution for row in rows.values()} == {Resolution.RAW}


def test_gpu_utilisation_is_smoothed_between_samples(
    live: redis.Redis, monkeypatch: pytest.MonkeyPatch, settings
):
    settings.GPUSHARE_TELEMETRY_SMOOTHING_S = 30.0
    nvml = FakeNvml([0])
    nvml.install(monkeypatch)
    telemetry_sample(now=1000.0)
    nvml.utilization = [100]
    telemetry_sample(now=1005.0)
    reading = gpu_live(live, node_name(""), 0)
    assert reading["utilization_percent"] == 100
    assert 10 < reading["utilization_smoothed"] < 20  # 100 x (1 - e^(-5/30)) = 15.4


# --- engines ------------------------------------------------------------------------------


def test_an_engines_load_is_the_max_of_its_signals_and_reaches_the_fair_queue(
    live: redis.Redis, stub_engine: StubEngine
):
    engine = make_engine(stub_engine.port)
    register(engine, kv_budget_units=4)
    reserve(engine, 3)  # 3 of 4 units reserved: more than the engine's own KV usage
    report = telemetry_sample()
    (reading,) = report.engines
    assert reading.kv_cache_usage == 0.25
    assert reading.reserved_fraction == pytest.approx(0.75)
    assert reading.gpu_utilization is None  # a CPU engine: no GPU signal, not a zero
    assert reading.load == pytest.approx(0.75)
    queue = fair_queue()
    assert float(
        str(queue.redis.hget(queue.keys.engine("m", engine.name), "load"))
    ) == pytest.approx(0.75)
    state = engine_live(live, engine.name)
    assert float(state["requests_running"]) == 2
    assert "gpu_utilization" not in state
    row = EngineSample.objects.get()
    assert (row.engine, row.model, row.load) == ("eng-a", "m", pytest.approx(0.75))
    assert row.gpu_utilization is None


def test_kv_usage_drives_the_load_when_it_is_the_largest(live, stub_engine: StubEngine):
    engine = make_engine(stub_engine.port)
    register(engine)
    stub_engine.values["kv"] = 0.9
    (reading,) = telemetry_sample().engines
    assert reading.load == pytest.approx(0.9)


def test_a_busy_utilization_gpu_does_not_load_a_gpu_engine(
    live, stub_engine: StubEngine, monkeypatch: pytest.MonkeyPatch
):
    FakeNvml([100]).install(monkeypatch)  # one decoding sequence reads 100 % here
    engine = make_engine(stub_engine.port, kind="gpu")
    register(engine)
    (reading,) = telemetry_sample().engines
    assert reading.gpu_utilization == pytest.approx(1.0)  # exported: the first sample
    assert reading.tensor_activity is None  # the fake GPU has no GPM
    assert reading.load == pytest.approx(0.25)  # the engine's KV usage, not the GPU's 100 %
    assert reading.load_signal == "kv_cache_usage"


def test_a_gpu_engine_counts_its_gpus_tensor_activity(
    live, stub_engine: StubEngine, monkeypatch: pytest.MonkeyPatch
):
    FakeNvml([100]).install(monkeypatch)
    activity = GpmActivity(sm_activity=0.77, tensor_activity=0.71)
    monkeypatch.setattr(gpus, "gpm_activity", lambda handles, window_s: [activity] * len(handles))
    engine = make_engine(stub_engine.port, kind="gpu")
    register(engine)
    (reading,) = telemetry_sample().engines
    assert (reading.sm_activity, reading.tensor_activity) == (0.77, 0.71)
    assert (reading.load, reading.load_signal) == (pytest.approx(0.71), "tensor_activity")
    queue = fair_queue()
    policy = queue.redis.hmget(queue.keys.engine("m", engine.name), ["load_signal", "load_closed"])
    assert policy == ["tensor_activity", "1"]  # over the 0.4 threshold: the gate is shut
    assert float(engine_live(live, engine.name)["tensor_activity"]) == 0.71


def test_preemptions_and_ttft_are_taken_between_two_readings(live, stub_engine: StubEngine):
    engine = make_engine(stub_engine.port)
    register(engine)
    stub_engine.values.update(preemptions=5, ttft_count=10, ttft_sum=2.0)
    (first,) = telemetry_sample(now=1000.0).engines
    assert first.preemptions == 0  # no baseline yet
    assert first.ttft_mean_s is None
    stub_engine.values.update(preemptions=8, ttft_count=14, ttft_sum=3.0)
    (second,) = telemetry_sample(now=1005.0).engines
    assert second.preemptions == 3
    assert second.ttft_mean_s == pytest.approx(0.25)
    assert float(engine_live(live, engine.name)["ttft_mean_s"]) == pytest.approx(0.25)


def test_an_engine_that_does_not_answer_still_gets_a_load_from_its_reservations(live):
    engine = make_engine(1)  # nothing listens on port 1
    register(engine, kv_budget_units=4)
    reserve(engine, 1)
    (reading,) = telemetry_sample().engines
    assert reading.kv_cache_usage is None
    assert reading.load == pytest.approx(0.25)


def test_overlapping_ticks_skip(live: redis.Redis):
    assert not telemetry_sample().skipped
    assert not live.exists(telemetry.LOCK_KEY)  # a tick lets its own lock go
    live.set(telemetry.LOCK_KEY, "another tick")
    assert telemetry_sample().skipped
    assert live.get(telemetry.LOCK_KEY) == "another tick"  # a skipped tick leaves it alone


# --- the ledger and rejections --------------------------------------------------------------


def usage(tenant: Tenant, **fields: Any) -> UsageRecord:
    values: dict[str, Any] = {
        "request_id": uuid.uuid4().hex, "tenant": tenant, "model": "m",
        "request_class": "standard", "outcome": "success", "prompt_tokens": 10,
        "completion_tokens": 5, "queue_wait_ms": 20, "latency_ms": 700,
        "finished_at": datetime.now(tz=UTC),
    }  # fmt: skip
    return UsageRecord.objects.create(**{**values, **fields})


def test_a_row_committed_late_below_a_visible_id_is_still_counted(live: redis.Redis, owner: Tenant):
    early, visible = usage(owner), usage(owner)
    late_pk = early.pk
    early.delete()  # its id was handed out; its transaction has not committed yet
    assert ledger_fold(live) == 0  # sees `visible`: the horizon for the next fold
    usage(owner, pk=late_pk)  # the late transaction commits
    assert ledger_fold(live) == 2  # both: the late one is not skipped
    assert visible.pk > late_pk
    assert ledger_counters(live)[("req", "acme", "standard", "m", "success")] == 2


def test_the_ledger_is_folded_into_counters_once(live: redis.Redis, owner: Tenant):
    usage(owner)
    usage(owner, request_class="interactive", queue_wait_ms=3000, latency_ms=4000)
    assert ledger_fold(live) == 0  # rows are counted a fold after they are first seen
    assert ledger_fold(live) == 2
    assert ledger_fold(live) == 0  # nothing new: nothing counted twice
    usage(owner, outcome="rejected", status_code=429, prompt_tokens=0, completion_tokens=0)
    assert ledger_fold(live) + ledger_fold(live) == 1
    counters = ledger_counters(live)
    assert counters[("req", "acme", "standard", "m", "success")] == 1
    assert counters[("req", "acme", "standard", "m", "rejected")] == 1
    assert counters[("tok", "acme", "standard", "m", "prompt")] == 10
    assert counters[("tok", "acme", "interactive", "m", "completion")] == 5
    # 20 ms waits fall in the 0.025 s bucket (index 2); 3 s in the 5 s one (index 9).
    assert counters[("wait", "acme", "standard", "m", "2")] == 1
    assert counters[("wait", "acme", "interactive", "m", "9")] == 1
    assert counters[("wait_sum", "acme", "interactive", "m")] == pytest.approx(3.0)
    assert counters[("lat_sum", "acme", "standard", "m")] == pytest.approx(0.7)
    # A rejected request never waited in line: no wait or latency observation.
    waits = sum(v for k, v in counters.items() if k[0] == "wait" and k[2] == "standard")
    assert waits == 1


def test_time_to_first_token_is_folded_into_buckets_when_a_token_came(
    live: redis.Redis, owner: Tenant
):
    usage(owner, ttft_ms=240)
    usage(owner, ttft_ms=4000)
    usage(owner, ttft_ms=None)  # no token came: no observation
    usage(owner, outcome="rejected", status_code=429, ttft_ms=0)  # never admitted
    assert ledger_fold(live) + ledger_fold(live) == 4
    counters = ledger_counters(live)
    ttft = {k[4]: v for k, v in counters.items() if k[0] == "ttft"}
    # 0.24 s falls in the 0.25 s bucket (index 2); 4 s in the 5 s one (index 9).
    assert ttft == {"2": 1, "9": 1}
    assert (ledger.TTFT_BUCKETS_S[2], ledger.TTFT_BUCKETS_S[9]) == (0.25, 5.0)
    assert counters[("ttft_sum", "acme", "standard", "m")] == pytest.approx(4.24)


def test_a_fold_reads_the_ledger_in_pages(live: redis.Redis, owner: Tenant):
    for _ in range(3):
        usage(owner)
    assert ledger_fold(live, page=2) == 0
    assert ledger_fold(live, page=2) == 2
    assert ledger_fold(live, page=2) == 1
    assert ledger_counters(live)[("req", "acme", "standard", "m", "success")] == 3


def note(
    client: redis.Redis, authorization: str, reason: str, status: int, request_class: str = ""
) -> None:
    rejection_note(
        authorization=authorization, reason=reason, status=status,
        request_class=request_class, endpoint="chat", at=1_790_000_000.0, client=client,
    )  # fmt: skip


def test_a_class_header_with_a_tab_or_a_malformed_note_never_stops_the_drain(
    live: redis.Redis, owner_key: IssuedKey
):
    bearer = f"Bearer {owner_key.raw_key}"
    note(live, bearer, "class_not_allowed", 403, request_class="inter\tactive")
    live.hincrby(PENDING_REJECTIONS_KEY, "a\tb", 1)  # as an older version could note it
    note(live, bearer, "rate_limit_exceeded", 429, request_class="interactive")
    assert rejections_drain(live) == 2
    assert rejections_drain(live) == 0
    assert rejection_counts(live) == {
        ("acme", "class_not_allowed", "403"): 1,
        ("acme", "rate_limit_exceeded", "429"): 1,
    }
    rows = UsageRecord.objects.filter(tenant__slug="acme").order_by("status_code")
    assert [(r.status_code, r.request_class) for r in rows] == [
        (403, "standard"),  # the key's default class: the header named none
        (429, "interactive"),
    ]


def test_rejections_are_counted_by_tenant_and_written_to_the_ledger(
    live: redis.Redis, owner_key: IssuedKey
):
    bearer = f"Bearer {owner_key.raw_key}"
    note(live, bearer, "rate_limit_exceeded", 429)
    note(live, bearer, "rate_limit_exceeded", 429)
    note(live, bearer, "queue_timeout", 503, request_class="interactive")
    note(live, "Bearer gs-nobody", "invalid_api_key", 401)
    assert rejections_drain(live) == 4
    assert rejections_drain(live) == 0
    assert rejection_counts(live) == {
        ("acme", "rate_limit_exceeded", "429"): 2,
        ("acme", "queue_timeout", "503"): 1,
        ("", "invalid_api_key", "401"): 1,
    }
    rows = UsageRecord.objects.filter(tenant__slug="acme").order_by("outcome")
    assert [(r.outcome, r.status_code, r.request_class, r.requests) for r in rows] == [
        ("rejected", 429, "standard", 2),  # the key's default class; one row for the second's 2
        ("timeout", 503, "interactive", 1),
    ]
    assert all(r.api_key_id == owner_key.api_key.pk for r in rows)
    assert UsageRecord.objects.count() == 2  # a 401 is nobody's: not in any tenant's ledger
    report = tenant_usage_report(
        tenant=owner_key.api_key.tenant, since=datetime(2026, 1, 1, tzinfo=UTC),
        until=datetime(2027, 1, 1, tzinfo=UTC),
    )  # fmt: skip
    assert (report.requests, report.rejected_429, report.timeouts) == (3, 2, 1)
    telemetry_sample()
    telemetry_sample()  # the fold runs a tick behind
    assert ledger_counters(live)[("req", "acme", "standard", "", "rejected")] == 2


def test_the_sampler_drains_rejections_before_folding_the_ledger(live, owner_key: IssuedKey):
    note(live, f"Bearer {owner_key.raw_key}", "insufficient_quota", 429)
    report = telemetry_sample()
    assert (report.rejections, report.ledger_rows) == (1, 0)
    assert telemetry_sample().ledger_rows == 1  # a tick later
    assert ledger_counters(live)[("req", "acme", "standard", "", "rejected")] == 1


# --- history --------------------------------------------------------------------------------


NOW = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)


def gpu_row(at: datetime, utilization: float | None, resolution: str = "raw", samples: int = 1):
    return GpuSample.objects.create(
        node="n1", gpu_index=0, resolution=resolution, at=at, samples=samples,
        utilization_percent=utilization, memory_total_bytes=80e9,
    )  # fmt: skip


def test_raw_samples_older_than_a_day_become_per_minute_means(live):
    old = NOW - timedelta(days=2)
    gpu_row(old, 10)
    gpu_row(old + timedelta(seconds=20), 30)
    gpu_row(old + timedelta(seconds=40), None)  # a reading without utilisation
    gpu_row(old + timedelta(seconds=60), 70)
    recent = gpu_row(NOW - timedelta(hours=1), 50)
    report = telemetry_rollup(now=NOW)
    assert report.to_minute == 4
    minutes = list(GpuSample.objects.filter(resolution=Resolution.MINUTE).order_by("at"))
    assert [(m.at, m.samples, m.utilization_percent) for m in minutes] == [
        (old, 3, 20.0),
        (old + timedelta(seconds=60), 1, 70.0),
    ]
    assert minutes[0].memory_total_bytes == 80e9
    assert GpuSample.objects.filter(resolution=Resolution.RAW).get() == recent
    assert telemetry_rollup(now=NOW).to_minute == 0  # done once


def test_minutes_older_than_a_month_become_hours_and_the_retention_drops_the_rest(live, settings):
    settings.GPUSHARE_TELEMETRY_RETENTION_DAYS = 365
    month_old = NOW - timedelta(days=40)
    gpu_row(month_old, 10, Resolution.MINUTE, samples=12)
    gpu_row(month_old + timedelta(minutes=1), 40, Resolution.MINUTE, samples=4)
    gpu_row(NOW - timedelta(days=400), 99, Resolution.HOUR, samples=720)
    report = telemetry_rollup(now=NOW)
    assert (report.to_hour, report.dropped) == (2, 1)
    hour = GpuSample.objects.get()
    assert hour.resolution == Resolution.HOUR
    assert hour.samples == 16
    assert hour.utilization_percent == pytest.approx((10 * 12 + 40 * 4) / 16)


def test_engine_history_is_downsampled_per_engine(live):
    old = NOW - timedelta(days=2)
    for engine, load in (("a", 0.2), ("a", 0.4), ("b", 0.9)):
        EngineSample.objects.create(engine=engine, model="m", resolution="raw", at=old, load=load)
    telemetry_rollup(now=NOW)
    rows = {r.engine: r for r in EngineSample.objects.filter(resolution=Resolution.MINUTE)}
    assert rows["a"].load == pytest.approx(0.3)
    assert rows["a"].samples == 2
    assert rows["b"].load == pytest.approx(0.9)
    assert rows["b"].kv_cache_usage is None


def test_jobs_the_queue_expired_become_timeout_rows_once(live, owner_key: IssuedKey, stub_engine):
    register(make_engine(stub_engine.port))
    queue = fair_queue()
    queue.set_tenant_policy("acme", TenantPolicy(weight=1.0, quota_bytes=100 * UNIT_BYTES))
    payload = {
        "tenant_id": owner_key.api_key.tenant_id, "api_key_id": owner_key.api_key.pk,
        "model": "m", "endpoint": "chat", "received_at": 1000.0, "body": {"user": "u-42"},
    }  # fmt: skip
    job = queue.enqueue(tenant="acme", pool="m", request_class="interactive", prompt_tokens=1,
                        max_tokens=1, kv_bytes=UNIT_BYTES, payload=json.dumps(payload),
                        now=1000.0)  # fmt: skip
    expired = queue.expire_waiting(now=1000.0 + 3600)
    assert expired == [job.job_id]
    assert rejections.timeouts_record(queue, "m", expired, now=1031.5) == 1
    assert rejections.timeouts_record(queue, "m", expired, now=1040.0) == 1  # written again: no-op
    row = UsageRecord.objects.get()
    assert (row.request_id, row.outcome, row.status_code, row.error_code) == (
        job.job_id, "timeout", 503, "queue_timeout",
    )  # fmt: skip
    assert (row.request_class, row.model, row.api_key_id) == (
        "interactive",
        "m",
        payload["api_key_id"],
    )
    assert row.queue_wait_ms == 31_500
    assert row.end_user == "u-42"
