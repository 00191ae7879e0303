"""What the platform reads from a vLLM engine's Prometheus `/metrics` page. Pure.

Names from vLLM's own source (vllm/v1/metrics/loggers.py):
- `vllm:cache_config_info`: a gauge fixed at 1 whose labels are the CacheConfig, among them
  `num_gpu_blocks` (KV blocks the engine allocated; on the CPU backend too) and `block_size`.
- `vllm:num_requests_running`, `vllm:num_requests_waiting`: gauges, per engine.
- `vllm:kv_cache_usage_perc`: KV-cache usage, 0..1.
- `vllm:num_preemptions` (a counter, sampled as `..._total`): requests preempted for KV room.
- `vllm:time_to_first_token_seconds`: a histogram; its `_sum` and `_count` give the mean TTFT
  between two readings.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

CACHE_CONFIG_INFO = "vllm:cache_config_info"
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
PREEMPTIONS = "vllm:num_preemptions_total"
TTFT_SUM = "vllm:time_to_first_token_seconds_sum"
TTFT_COUNT = "vllm:time_to_first_token_seconds_count"


@dataclass(frozen=True)
class EngineMetrics:
    num_blocks: int | None
    block_size: int | None
    requests_running: float
    requests_waiting: float
    kv_cache_usage: float | None
    # Counters since the engine started; None where the engine does not export them.
    preemptions_total: float | None = None
    ttft_seconds_sum: float | None = None
    ttft_seconds_count: float | None = None

    @property
    def kv_capacity_tokens(self) -> int | None:
        if self.num_blocks is None or self.block_size is None:
            return None
        return self.num_blocks * self.block_size

    @property
    def in_flight(self) -> float:
        return self.requests_running + self.requests_waiting


def _int_label(labels: dict[str, str], key: str) -> int | None:
    value = labels.get(key, "")
    return int(value) if value.isdigit() else None


WANTED = frozenset(
    {CACHE_CONFIG_INFO, REQUESTS_RUNNING, REQUESTS_WAITING, KV_CACHE_USAGE, PREEMPTIONS,
     TTFT_SUM, TTFT_COUNT}
)  # fmt: skip


def _wanted_lines(text: str) -> str:
    """Only the samples read here: vLLM's page is mostly histogram buckets, and parsing
    them all cost the worker more CPU than everything else the telemetry sample does."""
    kept = []
    for line in text.splitlines():
        if line and line[0] != "#":
            end = len(line)
            for mark in ("{", " "):
                found = line.find(mark)
                if 0 <= found < end:
                    end = found
            if line[:end] in WANTED:
                kept.append(line)
    return "\n".join(kept) + "\n"


def parse_engine_metrics(text: str) -> EngineMetrics:
    """The numbers the platform needs from a /metrics page; gauges of several engine
    cores (data parallel) are summed."""
    num_blocks: int | None = None
    block_size: int | None = None
    running = waiting = 0.0
    usage: float | None = None
    counters: dict[str, float] = {}
    for family in text_string_to_metric_families(_wanted_lines(text)):
        for sample in family.samples:
            if sample.name == CACHE_CONFIG_INFO:
                blocks = _int_label(sample.labels, "num_gpu_blocks")
                if blocks is not None:
                    num_blocks = (num_blocks or 0) + blocks
                block_size = _int_label(sample.labels, "block_size") or block_size
            elif sample.name == REQUESTS_RUNNING:
                running += sample.value
            elif sample.name == REQUESTS_WAITING:
                waiting += sample.value
            elif sample.name == KV_CACHE_USAGE:
                usage = max(usage or 0.0, sample.value)
            elif sample.name in (PREEMPTIONS, TTFT_SUM, TTFT_COUNT):
                counters[sample.name] = counters.get(sample.name, 0.0) + sample.value
    return EngineMetrics(
        num_blocks,
        block_size,
        running,
        waiting,
        usage,
        preemptions_total=counters.get(PREEMPTIONS),
        ttft_seconds_sum=counters.get(TTFT_SUM),
        ttft_seconds_count=counters.get(TTFT_COUNT),
    )
