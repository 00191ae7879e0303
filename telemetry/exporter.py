"""The platform in Prometheus text format, on two pages, so that every series is counted once.

`GET /metrics/cluster`: the cluster-wide series, read at scrape time from the shared state
every replica sees alike: the fair queue's snapshot and the samplers' live values in Redis,
the ledger's counters (folded into Redis by the sampler), tenants and engines from the
database. Any web replica answers it with the same values, so it is scraped as ONE target
(through the web Service), never per pod: one series per label set, whatever the number of
replicas, and `sum()` over it counts each request, token and byte once.

`GET /metrics`: the answering process's own series (`gpushare_build_info`), scraped per
pod. It carries nothing read from the shared state, so scraping every pod doubles nothing.

`gpushare_cluster_info` is on the cluster page only: more than one series of it in
Prometheus means the page is scraped by more than one target (an alert says so).

Every metric is named `gpushare_...` in base units (`_bytes`, `_seconds`, counters
`_total`) and listed in CLUSTER_METRICS or PROCESS_METRICS; the alert rules in
`platform/prometheus/rules.yml` may use only these (tests/test_metrics_rules.py checks it,
and runs the rules' unit tests with promtool). docs/METRICS.md has the scrape config.
"""

from __future__ import annotations

import functools
import hmac
import importlib.metadata
import ipaddress
import logging
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.urls import path
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from plumbing.errors import DomainError

log = logging.getLogger(__name__)

# name -> (type, help). Histograms and counters are named without their suffixes.
# The cluster-wide series: on /metrics/cluster, scraped once.
CLUSTER_METRICS: dict[str, tuple[str, str]] = {
    "gpushare_cluster_info": (
        "gauge",
        "1 on /metrics/cluster. Scraped once, through the Service: more than one series of "
        "it means every cluster-wide series is counted more than once.",
    ),
    "gpushare_queue_depth": (
        "gauge",
        "Requests waiting in the fair queue.",
    ),
    "gpushare_queue_running": (
        "gauge",
        "Requests picked and running on an engine.",
    ),
    "gpushare_queue_oldest_wait_seconds": (
        "gauge",
        "How long the oldest waiting request has waited.",
    ),
    "gpushare_admission_wait_seconds": (
        "histogram",
        "Time from arrival to being picked (finished requests).",
    ),
    "gpushare_time_to_first_token_seconds": (
        "histogram",
        "Time from arrival to the first token, queueing included (finished requests that got one).",
    ),
    "gpushare_request_latency_seconds": (
        "histogram",
        "Time from arrival to the last token (finished requests).",
    ),
    "gpushare_requests": (
        "counter",
        "Finished requests by outcome, from the usage ledger.",
    ),
    "gpushare_tokens": (
        "counter",
        "Prompt and completion tokens, from the usage ledger.",
    ),
    "gpushare_cached_prompt_tokens": (
        "counter",
        "Prompt tokens the engines' prefix caches held, from the usage ledger.",
    ),
    "gpushare_prefix_cache_hit_ratio": (
        "gauge",
        "Of a tenant's prompt tokens in the usage ledger, the share its engines' prefix caches "
        "held.",
    ),
    "gpushare_rejections": (
        "counter",
        "Requests refused before queueing, by reason and HTTP status.",
    ),
    "gpushare_unreserved_prompt_tokens": (
        "counter",
        "Prompt tokens the engines counted beyond what was reserved for them (never expected).",
    ),
    "gpushare_tenant_reserved_bytes": (
        "gauge",
        "KV memory the tenant holds now.",
    ),
    "gpushare_tenant_quota_bytes": (
        "gauge",
        "The tenant's quota of KV memory.",
    ),
    "gpushare_tenant_burst_bytes": (
        "gauge",
        "KV memory the tenant may borrow above its quota.",
    ),
    "gpushare_tenant_weight": (
        "gauge",
        "The tenant's weight: its share of contended capacity is its weight over the weights "
        "of the tenants contending.",
    ),
    "gpushare_engine_up": (
        "gauge",
        "1 while the engine is ready (or draining), 0 while it should run but cannot serve.",
    ),
    "gpushare_engine_load": (
        "gauge",
        "The samplers' load the offline gate reads: max(KV usage, reserved/capacity, GPU "
        "tensor activity), 0..1.",
    ),
    "gpushare_engine_seat_occupancy_ratio": (
        "gauge",
        "Sequences the engine says it runs / its seats (max_num_seqs), 0..1.",
    ),
    "gpushare_engine_sm_activity_ratio": (
        "gauge",
        "SM activity of the engine's GPU (NVML GPM, Hopper and later), 0..1.",
    ),
    "gpushare_engine_tensor_activity_ratio": (
        "gauge",
        "Tensor activity of the engine's GPU (NVML GPM, Hopper and later), 0..1.",
    ),
    "gpushare_engine_offline_inflight": (
        "gauge",
        "Of the engine's seats in flight, those offline jobs hold.",
    ),
    "gpushare_engine_kv_cache_usage_ratio": (
        "gauge",
        "The engine's own KV-cache usage, 0..1.",
    ),
    "gpushare_engine_reserved_bytes": (
        "gauge",
        "KV memory the fair queue has reserved on the engine.",
    ),
    "gpushare_engine_inflight": (
        "gauge",
        "Requests the fair queue has in flight on the engine.",
    ),
    "gpushare_engine_requests_running": (
        "gauge",
        "Requests the engine says it runs.",
    ),
    "gpushare_engine_requests_waiting": (
        "gauge",
        "Requests waiting inside the engine (should stay 0).",
    ),
    "gpushare_engine_preemptions": (
        "counter",
        "Requests the engine preempted for KV room.",
    ),
    "gpushare_engine_ttft_target_seconds": (
        "gauge",
        "The TTFT target of a class on the engine, held by bounding the seats of the classes "
        "below it (only while the class has one).",
    ),
    "gpushare_engine_ttft_p99_seconds": (
        "gauge",
        "The p99 of the class's latest times to first token on the engine, that its target's "
        "controller reads (only while it has a target and samples).",
    ),
    "gpushare_engine_seats_below": (
        "gauge",
        "The seats the classes below a class may hold on the engine now: its fixed bound, or "
        "its TTFT target's controller's (only while a bound is in force).",
    ),
    "gpushare_engine_seats_below_held": (
        "gauge",
        "The seats the classes below a class hold on the engine (only while the class has a "
        "TTFT target or a fixed bound).",
    ),
    "gpushare_engine_class_seats": (
        "gauge",
        "The seats a class may hold on the engine now: its seats and queue, less what the "
        "bounds of the classes above keep from it.",
    ),
    "gpushare_engine_class_held_back": (
        "gauge",
        "1 while a full seat bound of a class above holds the class back on the engine, else 0.",
    ),
    "gpushare_engine_kv_budget_bytes": (
        "gauge",
        "The KV the engine's jobs may reserve: its whole KV cache.",
    ),
    "gpushare_engine_kv_admission_scale": (
        "gauge",
        "The share of the KV budget picks may fill: below 1 after the engine preempted, while "
        "it predicts what requests reserve; 1 otherwise.",
    ),
    "gpushare_engine_kv_beyond_reserved_bytes": (
        "gauge",
        "The KV the engine measured in use beyond its jobs' reservations at its last reading "
        "(growth nobody counted; only while it predicts and the reading is recent).",
    ),
    "gpushare_gpu_utilization_ratio": (
        "gauge",
        "NVML utilization.gpu: the share of time any kernel ran, 0..1; busy with a single "
        "decoding sequence, so not how much of the GPU the work uses.",
    ),
    "gpushare_gpu_sm_activity_ratio": (
        "gauge",
        "NVML GPM SM activity: the share of SMs busy, 0..1 (Hopper and later).",
    ),
    "gpushare_gpu_tensor_activity_ratio": (
        "gauge",
        "NVML GPM tensor activity: the share of time SMs ran tensor instructions, 0..1.",
    ),
    "gpushare_gpu_memory_used_bytes": (
        "gauge",
        "GPU memory in use.",
    ),
    "gpushare_gpu_memory_total_bytes": (
        "gauge",
        "GPU memory in all.",
    ),
    "gpushare_gpu_temperature_celsius": (
        "gauge",
        "GPU temperature.",
    ),
    "gpushare_gpu_power_watts": (
        "gauge",
        "GPU power draw.",
    ),
    "gpushare_engine_oom": (
        "counter",
        "Deaths of the engine's process out of memory: torch or CUDA out of memory, no memory "
        "for its KV cache at start, or a SIGKILL the platform did not send (the OOM killer).",
    ),
}

# Series that exist only while a class has a seat bound on an engine (a TTFT target, a
# fixed bound, or a measured target): with none set anywhere they have no samples.
BOUND_METRICS: tuple[str, ...] = (
    "gpushare_engine_ttft_target_seconds",
    "gpushare_engine_ttft_p99_seconds",
    "gpushare_engine_seats_below",
    "gpushare_engine_seats_below_held",
)

# The answering process's own series: on /metrics, scraped per pod. A pod's web workers
# share its port and a scrape reaches one of them, so only what every worker of a pod
# reports alike belongs here (no per-process counters: they would jump between workers).
PROCESS_METRICS: dict[str, tuple[str, str]] = {
    "gpushare_build_info": (
        "gauge",
        "1, labelled with the version, commit and Python of the process that answered.",
    ),
}

METRICS: dict[str, tuple[str, str]] = {**CLUSTER_METRICS, **PROCESS_METRICS}

# Engine statuses in which an engine should serve: `up` is exported for these only, so a
# deliberately stopped engine is not "down".
_EXPECTED_UP = ("starting", "warming", "ready", "draining", "failed")


def _gauge(name: str, labels: list[str]) -> GaugeMetricFamily:
    assert METRICS[name][0] == "gauge", name
    return GaugeMetricFamily(name, METRICS[name][1], labels=labels)


def _counter(name: str, labels: list[str]) -> CounterMetricFamily:
    assert METRICS[name][0] == "counter", name
    return CounterMetricFamily(name, METRICS[name][1], labels=labels)


def _histogram(name: str, labels: list[str]) -> HistogramMetricFamily:
    assert METRICS[name][0] == "histogram", name
    return HistogramMetricFamily(name, METRICS[name][1], labels=labels)


def _hit_ratios(counters: dict[tuple[str, ...], float]) -> GaugeMetricFamily:
    """Each tenant's prefix-cache hit rate: of its prompt tokens in the ledger, the share
    its engines' prefix caches held (all its classes and models)."""
    prompt: dict[str, float] = {}
    cached: dict[str, float] = {}
    for key, value in counters.items():
        if key[0] == "tok" and key[4] == "prompt":
            prompt[key[1]] = prompt.get(key[1], 0.0) + value
        elif key[0] == "cached":
            cached[key[1]] = cached.get(key[1], 0.0) + value
    family = _gauge("gpushare_prefix_cache_hit_ratio", ["tenant"])
    for tenant, total in sorted(prompt.items()):
        if total > 0:
            family.add_metric([tenant], cached.get(tenant, 0.0) / total)
    return family


def _histograms(
    counters: dict[tuple[str, ...], float], kind: str, sum_kind: str, buckets: tuple[float, ...]
) -> dict[tuple[str, str, str], tuple[list[tuple[str, float]], float]]:
    """Cumulative buckets and sums per (tenant, class, model) from the folded counters."""
    per_labels: dict[tuple[str, str, str], dict[str, float]] = {}
    sums: dict[tuple[str, str, str], float] = {}
    for key, value in counters.items():
        if key[0] == kind:
            labels = (key[1], key[2], key[3])
            per_labels.setdefault(labels, {})[key[4]] = value
        elif key[0] == sum_kind:
            sums[(key[1], key[2], key[3])] = value
    result = {}
    for labels, counts in per_labels.items():
        running = 0.0
        cumulative = []
        for index, bound in enumerate(buckets):
            running += counts.get(str(index), 0.0)
            cumulative.append((repr(bound), running))
        running += counts.get("inf", 0.0)
        cumulative.append(("+Inf", running))
        result[labels] = (cumulative, sums.get(labels, 0.0))
    return result


class ClusterCollector(Collector):
    """The cluster-wide series, read from the shared state at scrape time: the same on every
    replica (see the module's docstring)."""

    def collect(self) -> Iterator[Metric]:
        info = _gauge("gpushare_cluster_info", [])
        info.add_metric([], 1)
        yield info
        parts = (
            self._queue, self._seats, self._kv, self._ledger, self._tenants, self._engines,
            self._gpus, self._engine_ooms,
        )  # fmt: skip
        for part in parts:
            try:
                yield from part()
            except Exception:  # one unreachable source must not blank the whole page
                log.exception("metrics: %s failed", part.__name__)

    def _queue(self) -> Iterator[Metric]:
        from scheduler.pools.policies import fair_queue

        snapshot = fair_queue().snapshot()
        labels = ["pool", "class", "tenant"]
        depth = _gauge("gpushare_queue_depth", labels)
        running = _gauge("gpushare_queue_running", labels)
        oldest = _gauge("gpushare_queue_oldest_wait_seconds", labels)
        for row in snapshot.queues:
            values = [row.pool, row.request_class, row.tenant]
            depth.add_metric(values, row.waiting)
            running.add_metric(values, row.running)
            oldest.add_metric(values, row.oldest_wait_s or 0.0)
        reserved = _gauge("gpushare_tenant_reserved_bytes", ["tenant"])
        for tenant, used in snapshot.tenant_reserved_bytes.items():
            reserved.add_metric([tenant], used)
        engine_reserved = _gauge("gpushare_engine_reserved_bytes", ["engine"])
        for engine, used in snapshot.engine_reserved_bytes.items():
            engine_reserved.add_metric([engine], used)
        inflight = _gauge("gpushare_engine_inflight", ["engine"])
        for engine, count in snapshot.engine_inflight.items():
            inflight.add_metric([engine], count)
        offline = _gauge("gpushare_engine_offline_inflight", ["engine"])
        for engine in snapshot.engine_inflight:
            offline.add_metric([engine], snapshot.engine_offline.get(engine, 0))
        yield from (depth, running, oldest, reserved, engine_reserved, inflight, offline)

    def _seats(self) -> Iterator[Metric]:
        """Each engine's seats by class (`FairQueue.seat_reports`): the bounds of the classes
        with a target or a fixed bound, and for every class what it may hold and whether a
        bound above holds it back."""
        from protocol.classes import REQUEST_CLASSES
        from scheduler.pools.policies import fair_queue

        labels = ["engine", "class"]
        target = _gauge("gpushare_engine_ttft_target_seconds", labels)
        p99 = _gauge("gpushare_engine_ttft_p99_seconds", labels)
        below = _gauge("gpushare_engine_seats_below", labels)
        below_held = _gauge("gpushare_engine_seats_below_held", labels)
        class_seats = _gauge("gpushare_engine_class_seats", labels)
        held_back = _gauge("gpushare_engine_class_held_back", labels)
        for report in fair_queue().seat_reports():
            engine = report.engine_id
            for bound in report.bounds:
                values = [engine, bound.request_class]
                if bound.target_s is not None:
                    target.add_metric(values, bound.target_s)
                if bound.p99_s is not None:
                    p99.add_metric(values, bound.p99_s)
                if bound.bound is not None:  # None: no bound in force (a lapsed target)
                    below.add_metric(values, bound.bound)
                below_held.add_metric(values, bound.held)
            for request_class in REQUEST_CLASSES:
                values = [engine, request_class]
                class_seats.add_metric(values, report.class_seats(request_class))
                held_back.add_metric(values, 1 if report.limits.get(request_class) else 0)
        yield from (target, p99, below, below_held, class_seats, held_back)

    def _kv(self) -> Iterator[Metric]:
        """Each engine's KV reservations (`FairQueue.reservation_reports`)."""
        from scheduler.pools.policies import fair_queue

        budget = _gauge("gpushare_engine_kv_budget_bytes", ["engine"])
        scale = _gauge("gpushare_engine_kv_admission_scale", ["engine"])
        beyond = _gauge("gpushare_engine_kv_beyond_reserved_bytes", ["engine"])
        for report in fair_queue().reservation_reports():
            budget.add_metric([report.engine_id], report.budget_bytes)
            scale.add_metric([report.engine_id], report.scale)
            if report.excess_bytes is not None:
                beyond.add_metric([report.engine_id], report.excess_bytes)
        yield from (budget, scale, beyond)

    def _ledger(self) -> Iterator[Metric]:
        from telemetry.ledger import (
            LATENCY_BUCKETS_S,
            TTFT_BUCKETS_S,
            WAIT_BUCKETS_S,
            ledger_counters,
        )
        from telemetry.rejections import rejection_counts

        counters = ledger_counters()
        labels = ["tenant", "class", "model"]
        requests = _counter("gpushare_requests", [*labels, "outcome"])
        tokens = _counter("gpushare_tokens", [*labels, "kind"])
        cached = _counter("gpushare_cached_prompt_tokens", labels)
        for key, value in sorted(counters.items()):
            if key[0] == "req":
                requests.add_metric(list(key[1:5]), value)
            elif key[0] == "tok":
                tokens.add_metric(list(key[1:5]), value)
            elif key[0] == "cached":
                cached.add_metric(list(key[1:4]), value)
        yield from (requests, tokens, cached, _hit_ratios(counters))
        for name, kind, sum_kind, buckets in (
            ("gpushare_admission_wait_seconds", "wait", "wait_sum", WAIT_BUCKETS_S),
            ("gpushare_time_to_first_token_seconds", "ttft", "ttft_sum", TTFT_BUCKETS_S),
            ("gpushare_request_latency_seconds", "lat", "lat_sum", LATENCY_BUCKETS_S),
        ):
            family = _histogram(name, labels)
            for values, (cumulative, total) in sorted(
                _histograms(counters, kind, sum_kind, buckets).items()
            ):
                family.add_metric(list(values), cumulative, total)
            yield family
        rejections = _counter("gpushare_rejections", ["tenant", "reason", "status"])
        for (tenant, reason, status), count in sorted(rejection_counts().items()):
            rejections.add_metric([tenant, reason, status], count)
        yield rejections

    def _tenants(self) -> Iterator[Metric]:
        from capacity.units import units_to_bytes
        from telemetry.rejections import unreserved_prompt_tokens
        from tenants.models import Tenant

        quota = _gauge("gpushare_tenant_quota_bytes", ["tenant"])
        burst = _gauge("gpushare_tenant_burst_bytes", ["tenant"])
        weight = _gauge("gpushare_tenant_weight", ["tenant"])
        unreserved = _counter("gpushare_unreserved_prompt_tokens", ["tenant"])
        missed = unreserved_prompt_tokens()
        for slug, quota_units, burst_units, weight_value in Tenant.objects.filter(
            is_active=True
        ).values_list("slug", "quota_units", "burst_units", "weight"):
            quota.add_metric([slug], units_to_bytes(quota_units))
            burst.add_metric([slug], units_to_bytes(burst_units))
            weight.add_metric([slug], weight_value)
            unreserved.add_metric([slug], missed.get(slug, 0))  # from 0, so rate() sees it
        yield from (quota, burst, weight, unreserved)

    def _engines(self) -> Iterator[Metric]:
        from plumbing.redis import redis_client
        from scheduler.models import Engine
        from telemetry.engines import engine_live

        client = redis_client()
        labels = ["engine", "model"]
        up = _gauge("gpushare_engine_up", labels)
        gauges: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "load": _gauge("gpushare_engine_load", labels),
            "seat_occupancy": _gauge("gpushare_engine_seat_occupancy_ratio", labels),
            "sm_activity": _gauge("gpushare_engine_sm_activity_ratio", labels),
            "tensor_activity": _gauge("gpushare_engine_tensor_activity_ratio", labels),
            "kv_cache_usage": _gauge("gpushare_engine_kv_cache_usage_ratio", labels),
            "requests_running": _gauge("gpushare_engine_requests_running", labels),
            "requests_waiting": _gauge("gpushare_engine_requests_waiting", labels),
            "preemptions_total": _counter("gpushare_engine_preemptions", labels),
        }
        engines = Engine.objects.filter(status__in=_EXPECTED_UP).values_list(
            "name", "served_model_name", "status"
        )
        for name, model, status in engines:
            up.add_metric([name, model], 1 if status in ("ready", "draining") else 0)
            live = engine_live(client, name)
            for field, family in gauges.items():
                if field in live:
                    family.add_metric([name, model], float(live[field]))
        yield up
        yield from gauges.values()

    def _gpus(self) -> Iterator[Metric]:
        from plumbing.redis import redis_client
        from telemetry.gpus import gpu_live, gpus_key

        client = redis_client()
        labels = ["node", "gpu"]
        fields = {
            "utilization_percent": _gauge("gpushare_gpu_utilization_ratio", labels),
            "memory_used_bytes": _gauge("gpushare_gpu_memory_used_bytes", labels),
            "memory_total_bytes": _gauge("gpushare_gpu_memory_total_bytes", labels),
            "temperature_c": _gauge("gpushare_gpu_temperature_celsius", labels),
            "power_w": _gauge("gpushare_gpu_power_watts", labels),
            "sm_activity": _gauge("gpushare_gpu_sm_activity_ratio", labels),
            "tensor_activity": _gauge("gpushare_gpu_tensor_activity_ratio", labels),
        }
        for member in sorted(str(m) for m in client.smembers(gpus_key())):
            node, _, index = member.rpartition(":")
            live = gpu_live(client, node, int(index))
            if not live:  # expired: that GPU's sampler stopped
                client.srem(gpus_key(), member)
                continue
            for field, family in fields.items():
                if field in live:
                    value = live[field] / 100.0 if field == "utilization_percent" else live[field]
                    family.add_metric([node, index], value)
        yield from fields.values()

    def _engine_ooms(self) -> Iterator[Metric]:
        """Every registered engine's out-of-memory deaths (`scheduler.engines.oom`), from 0,
        so that increase() sees its first one; a count under a model the engine no longer
        serves stays until the engine is deleted."""
        from scheduler.engines.oom import engine_oom_counts
        from scheduler.models import Engine

        counts = engine_oom_counts()
        engines = set(Engine.objects.values_list("name", "served_model_name"))
        names = {name for name, _ in engines}
        family = _counter("gpushare_engine_oom", ["engine", "model"])
        for engine, model in sorted(engines | {key for key in counts if key[0] in names}):
            family.add_metric([engine, model], counts.get((engine, model), 0))
        yield family


class BuildCollector(Collector):
    """The answering process's own series (see PROCESS_METRICS)."""

    def collect(self) -> Iterator[Metric]:
        info = _gauge("gpushare_build_info", ["version", "commit", "python"])
        info.add_metric(list(build_labels()), 1)
        yield info


@functools.cache
def build_labels() -> tuple[str, str, str]:
    """(version, commit, python) of this process: fixed for its life, read once."""
    python = ".".join(str(part) for part in sys.version_info[:3])
    return _version(), settings.GPUSHARE_BUILD_COMMIT, python


def _version() -> str:
    """The installed package's version, else pyproject.toml's (the images copy the code, not
    the package), else "unknown"."""
    try:
        return importlib.metadata.version("gpushare")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        with (settings.BASE_DIR / "pyproject.toml").open("rb") as file:
            return str(tomllib.load(file)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


def cluster_metrics_text() -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector())
    return generate_latest(registry)


def process_metrics_text() -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BuildCollector())
    return generate_latest(registry)


def _serve(request: HttpRequest, text: Callable[[], bytes]) -> HttpResponse:
    """Both pages name the platform to whoever reads them (the cluster page every tenant, its
    quota and its use): with GPUSHARE_METRICS_TOKEN set, for whoever bears it; without, for
    this machine only (a curl on the host), never for a client of another address."""
    token = settings.GPUSHARE_METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            return HttpResponse("Unauthorized\n", status=401, content_type="text/plain")
    elif not _from_this_machine(request):
        return HttpResponse(
            f"Forbidden: set GPUSHARE_METRICS_TOKEN to scrape {request.path} from another "
            "machine\n",
            status=403,
            content_type="text/plain",
        )
    return HttpResponse(text(), content_type=CONTENT_TYPE_LATEST)


def metrics_view(request: HttpRequest) -> HttpResponse:
    """`/metrics`: this process's own series; scraped per pod."""
    return _serve(request, process_metrics_text)


def cluster_metrics_view(request: HttpRequest) -> HttpResponse:
    """`/metrics/cluster`: the cluster-wide series; scraped once, through the Service."""
    return _serve(request, cluster_metrics_text)


def _from_this_machine(request: HttpRequest) -> bool:
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR") or "").is_loopback
    except ValueError:  # no address (a unix socket) or not one
        return False


async def rejection_hook(
    *, authorization: str, request_class: str, endpoint: str, exc: DomainError
) -> None:
    """Called where the OpenAI API turns a domain error into a response: notes it with one
    Redis HINCRBY (telemetry.rejections.rejection_note). Never raises: counting must not
    change the answer."""
    from telemetry.rejections import rejection_note

    fields: dict[str, Any] = {
        "authorization": authorization,
        "reason": exc.code or type(exc).__name__,
        "status": exc.http_status,
        "request_class": request_class,
        "endpoint": endpoint,
        "at": time.time(),
    }
    try:
        await sync_to_async(rejection_note, thread_sensitive=False)(**fields)
    except Exception:
        log.warning("could not note a rejection (%s)", fields["reason"], exc_info=True)


urlpatterns = [
    path("metrics", metrics_view, name="metrics"),
    path("metrics/cluster", cluster_metrics_view, name="metrics-cluster"),
]
