"""Telemetry end to end: real traffic through the openai client to the real vLLM CPU engine,
then /metrics/cluster and /metrics (parsed by prometheus-client), the series of a seat bound
once a pool has a TTFT target, the sampler's history and load (real pynvml on a machine
without an NVIDIA driver: no GPU fields), and the usage report over the ledger."""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from capacity.units import UNIT_BYTES
from telemetry.exporter import BOUND_METRICS, CLUSTER_METRICS
from tests.e2e.conftest import MODEL, make_tenant
from tests.support.harness import Platform

T = TypeVar("T")
Samples = dict[str, list[tuple[dict[str, str], float]]]
# Read from NVML (GPM activity of a GPU, and of an engine through its GPU): no samples here.
GPU_METRICS = [name for name in CLUSTER_METRICS if name.startswith("gpushare_gpu_")] + [
    "gpushare_engine_sm_activity_ratio",
    "gpushare_engine_tensor_activity_ratio",
]


def client_for(platform: Platform, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{platform.base_url}/v1", api_key=key, max_retries=0)


def wait_for(predicate: Callable[[], T | None], timeout: float = 45.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError("condition not met in time")


def scrape(platform: Platform, path: str = "/metrics/cluster") -> Samples:
    response = httpx.get(f"{platform.base_url}{path}", timeout=10)
    assert response.status_code == 200
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(
        v for ls, v in samples.get(name, []) if all(ls.get(k) == x for k, x in labels.items())
    )


def chat(client: openai.OpenAI, *, stream: bool = False) -> int:
    """One chat request; returns the tokens it used."""
    messages: Any = [{"role": "user", "content": "tell me about GPUs"}]
    if stream:
        chunks = list(
            client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=8, stream=True,
                stream_options={"include_usage": True},
            )
        )  # fmt: skip
        usage = chunks[-1].usage
    else:
        usage = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8).usage
    assert usage is not None
    return usage.total_tokens


@pytest.fixture(scope="module")
def traffic(platform_server: Platform) -> dict[str, Any]:
    """A tenant with real traffic (streamed and not), one 429 from its rate limit, and the
    sampler's ticks in between (every 5 s)."""
    slug, key = make_tenant(platform_server, rpm="6")
    client = client_for(platform_server, key)
    tokens = chat(client) + chat(client, stream=True)
    time.sleep(6)  # a sampler tick between requests: TTFT is a mean between two readings
    tokens += chat(client) + chat(client, stream=True)
    rejected = 0
    for _ in range(4):
        try:
            tokens += chat(client)
        except openai.RateLimitError:
            rejected += 1
    assert rejected >= 1
    return {
        "slug": slug, "key": key, "tokens": tokens, "rejected": rejected,
        "succeeded": 8 - rejected,
    }  # fmt: skip


def test_metrics_expose_every_documented_metric_after_real_traffic(platform_server, traffic):
    slug = traffic["slug"]

    def ready() -> Samples | None:
        samples = scrape(platform_server)
        done = total(samples, "gpushare_requests_total", tenant=slug, outcome="success")
        seen_429 = total(samples, "gpushare_rejections_total", tenant=slug, status="429")
        ttft = total(samples, "gpushare_time_to_first_token_seconds_count", tenant=slug)
        expected = (traffic["succeeded"], traffic["rejected"])
        return samples if (done, seen_429) == expected and ttft > 0 else None

    samples = wait_for(ready)
    assert all(name.startswith("gpushare_") for name in samples)
    families = {
        name.removesuffix("_total").removesuffix("_bucket").removesuffix("_count")
        .removesuffix("_sum")
        for name in samples
    }  # fmt: skip
    # The series of seat bounds exist only while one is set: the next test sets one.
    absent = [*GPU_METRICS, *BOUND_METRICS]
    missing = [name for name in CLUSTER_METRICS if name not in families and name not in absent]
    assert not missing
    # A CPU machine: the GPU metrics are documented but have no samples, never zeros. No
    # seat bound is set: nor have the bounds' series.
    assert not [name for name in samples if name in absent]
    seats = {"engine": MODEL, "class": "offline"}
    assert total(samples, "gpushare_engine_class_seats", **seats) >= 16  # all its seats
    assert total(samples, "gpushare_engine_class_held_back", **seats) == 0

    engine = {"engine": MODEL, "model": MODEL}
    assert total(samples, "gpushare_engine_up", **engine) == 1
    assert 0 <= total(samples, "gpushare_engine_load", **engine) <= 1
    assert 0 <= total(samples, "gpushare_engine_kv_cache_usage_ratio", **engine) <= 1
    tokens = total(samples, "gpushare_tokens_total", tenant=slug, model=MODEL)
    assert tokens == traffic["tokens"]
    waits = total(samples, "gpushare_admission_wait_seconds_count", tenant=slug)
    assert waits == total(samples, "gpushare_requests_total", tenant=slug, outcome="success")
    assert total(samples, "gpushare_rejections_total", tenant=slug, reason="rate_limit_exceeded") \
        == traffic["rejected"]  # fmt: skip
    assert total(samples, "gpushare_tenant_quota_bytes", tenant=slug) == 4 * UNIT_BYTES
    # The streamed requests got a first token (the others' may count too).
    assert 2 <= total(samples, "gpushare_time_to_first_token_seconds_count", tenant=slug) <= waits
    # Each pod's own page: only the build it runs.
    assert set(scrape(platform_server, "/metrics")) == {"gpushare_build_info"}


def test_a_pools_ttft_target_shows_its_bound_on_the_engine(platform_server):
    """An interactive target of 60 s, which every first token here meets: its controller
    keeps every seat for the classes below (docs/METRICS.md, seats by class)."""
    platform_server.manage("pool", "targets", MODEL, "--ttft-ms", "interactive=60000")
    try:
        _, key = make_tenant(platform_server, classes="interactive")
        client = client_for(platform_server, key)
        chat(client, stream=True)
        chat(client, stream=True)
        interactive = {"engine": MODEL, "class": "interactive"}

        def measured() -> Samples | None:
            samples = scrape(platform_server)
            p99 = samples.get("gpushare_engine_ttft_p99_seconds", [])
            return samples if any(ls == interactive for ls, _ in p99) else None

        samples = wait_for(measured)  # the bound lapses 30 s after its last measure
        families = {name for name in samples if name in CLUSTER_METRICS}
        assert set(BOUND_METRICS) <= families
        assert total(samples, "gpushare_engine_ttft_target_seconds", **interactive) == 60
        assert 0 < total(samples, "gpushare_engine_ttft_p99_seconds", **interactive) < 60
        # Every first token within the target: the classes below may hold all the seats.
        seats = total(samples, "gpushare_engine_class_seats", **interactive)
        assert seats >= 16
        assert total(samples, "gpushare_engine_seats_below", **interactive) == seats
        assert total(samples, "gpushare_engine_seats_below_held", **interactive) >= 0
        assert total(samples, "gpushare_engine_class_held_back", engine=MODEL) == 0
        # Only interactive has a target.
        targets = samples["gpushare_engine_ttft_target_seconds"]
        assert [labels["class"] for labels, _ in targets] == ["interactive"]
    finally:
        platform_server.manage("pool", "targets", MODEL, "--ttft-ms", "inherit")
    after = scrape(platform_server)
    assert "gpushare_engine_ttft_target_seconds" not in after


def shell_json(platform: Platform, code: str) -> Any:
    return platform.shell(f"import json\n{code}")


def test_the_sampler_runs_for_real_on_cpu_with_no_gpu_fields(platform_server, traffic):
    def sampled() -> dict[str, Any] | None:
        data = shell_json(
            platform_server,
            "from telemetry.models import EngineSample, GpuSample\n"
            "from scheduler.pools.policies import fair_queue\n"
            f"rows = list(EngineSample.objects.filter(engine='{MODEL}').values())\n"
            "q = fair_queue()\n"
            f"load = q.redis.hget(q.keys.engine('{MODEL}', '{MODEL}'), 'load')\n"
            "print(json.dumps({'rows': rows, 'gpus': GpuSample.objects.count(), "
            "'load': load}, default=str))",
        )
        # Two readings of the engine's /metrics: on a starved machine (CI runs another
        # platform's two engines beside this one) a sample's /metrics can time out, and the
        # sampler keeps the row with its other signals (seen: a ReadTimeout, a None KV usage).
        measured = [row for row in data["rows"] if row["kv_cache_usage"] is not None]
        return data if len(measured) >= 2 else None

    data = wait_for(sampled)
    assert data["gpus"] == 0  # no NVIDIA driver here: no GPU rows at all
    rows = data["rows"]
    assert all(row["gpu_utilization"] is None for row in rows)
    assert all(row["resolution"] == "raw" for row in rows)
    assert all(0 <= row["load"] <= 1 for row in rows)
    assert any(row["ttft_mean_s"] for row in rows)
    assert 0 <= float(data["load"]) <= 1  # the offline gate reads the sampler's load


def test_usage_report_over_real_traffic(platform_server, traffic):
    slug, key = traffic["slug"], traffic["key"]

    def own_usage() -> dict[str, Any] | None:
        response = httpx.get(
            f"{platform_server.base_url}/v1/usage",
            params={"period": "day"},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert response.status_code == 200
        body = response.json()["total"]
        rejected = body["requests"]["by_outcome"]["rejected"]
        done = body["requests"]["by_outcome"]["success"]
        return body if (done, rejected) == (traffic["succeeded"], traffic["rejected"]) else None

    mine = wait_for(own_usage)
    assert mine["tenant"] == slug
    assert mine["rejected_429"] == traffic["rejected"]
    assert mine["tokens"]["total"] == traffic["tokens"]
    assert (
        mine["requests"]["by_outcome"]["success"] == mine["requests"]["total"] - traffic["rejected"]
    )
    assert mine["reservation"]["reserved_unit_hours"] > 0
    assert mine["reservation"]["peak_reserved_units"] > 0
    assert mine["latency_ms"]["p99"] >= mine["latency_ms"]["p50"] > 0

    _, outsider_key = make_tenant(platform_server)
    theirs = httpx.get(
        f"{platform_server.base_url}/v1/usage",
        headers={"Authorization": f"Bearer {outsider_key}"},
    ).json()["total"]
    assert theirs["tenant"] != slug
    assert theirs["requests"]["total"] == 0

    report = json.loads(platform_server.manage("report", "--tenant", slug, "--period", "day",
                                               "--format", "json"))  # fmt: skip
    assert report["tokens"] == mine["tokens"]
    assert report["requests"]["by_outcome"] == mine["requests"]["by_outcome"]
    rows = list(csv.DictReader(io.StringIO(
        platform_server.manage("report", "--tenant", slug, "--period", "day", "--format", "csv")
    )))  # fmt: skip
    assert int(rows[0]["rejected_429"]) == traffic["rejected"]
