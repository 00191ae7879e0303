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

import re
from collections.abc import Iterator
from dataclasses import dataclass

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
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _wanted_samples(text: str) -> Iterator[tuple[str, str, float]]:
    """(name, labels as written, value) of the samples read here, in the text exposition
    format (`name{labels} value [timestamp]`). Not a general parser: vLLM's page is mostly
    histogram buckets, and prometheus_client's parser, even fed only the wanted lines, costs
    a fifth of the telemetry sampler's CPU; each wanted name is looked for at the start of a
    line instead of reading every line
    (docs/decisions/0007-periodic-work-on-each-workers-ticker.md)."""
    page = "\n" + text
    for name in WANTED:
        marker = "\n" + name
        at = page.find(marker)
        while at != -1:
            end = page.find("\n", at + 1)
            line = page[at + 1 : end if end != -1 else len(page)]
            sample = _sample(name, line)
            if sample is not None:
                yield sample
            at = page.find(marker, at + 1)


def _sample(name: str, line: str) -> tuple[str, str, float] | None:
    """The sample of `line` if it is one of `name` (not of a longer name it begins)."""
    rest = line[len(name) :]
    labels = ""
    if rest.startswith("{"):
        close = rest.rfind("}")
        labels, rest = rest[1:close], rest[close + 1 :]
    elif not rest.startswith(" "):
        return None
    fields = rest.split()
    try:
        return name, labels, float(fields[0])
    except (IndexError, ValueError):  # a malformed sample: the others still count
        return None


def parse_engine_metrics(text: str) -> EngineMetrics:
    """The numbers the platform needs from a /metrics page; gauges of several engine
    cores (data parallel) are summed."""
    num_blocks: int | None = None
    block_size: int | None = None
    running = waiting = 0.0
    usage: float | None = None
    counters: dict[str, float] = {}
    for name, labels, value in _wanted_samples(text):
        if name == CACHE_CONFIG_INFO:
            info = dict(_LABEL.findall(labels))
            blocks = _int_label(info, "num_gpu_blocks")
            if blocks is not None:
                num_blocks = (num_blocks or 0) + blocks
            block_size = _int_label(info, "block_size") or block_size
        elif name == REQUESTS_RUNNING:
            running += value
        elif name == REQUESTS_WAITING:
            waiting += value
        elif name == KV_CACHE_USAGE:
            usage = max(usage or 0.0, value)
        else:  # the counters
            counters[name] = counters.get(name, 0.0) + value
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
