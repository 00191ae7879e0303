"""The capacity planner's arithmetic (pure: no database, no Django)."""

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capacity.kvcost import KvShape, tokens_per_unit
from capacity.planner import (
    MODEL_PRESETS,
    SAFETY_FACTOR_RANGE,
    per_card_qps,
    plan_fleet,
    plan_memory,
)
from capacity.units import GIB, UNIT_BYTES

LLAMA_3_8B = MODEL_PRESETS["llama-3-8b"]
LLAMA_3_70B = MODEL_PRESETS["llama-3-70b"]
MIB = 1024**2


def _llama_8b_on_a100_80(**overrides: Any):
    args: dict[str, Any] = {
        "kv_shape": LLAMA_3_8B.kv_shape,
        "weights_gib": 15.0,
        "gpu_memory_gib": 80,
        "utilisation": 0.9,
        "reserve_gib": 2,
        "prompt_tokens": 600,
        "output_tokens": 120,
    }
    args.update(overrides)
    return plan_memory(**args)


def test_the_presets_read_their_shape_through_the_kv_cost_model():
    # 2 x 32 layers x 8 KV heads x 128 dims x 2 bytes: 128 KiB, 2,048 tokens a unit.
    assert LLAMA_3_8B.kv_shape.bytes_per_token == 128 * 1024
    assert tokens_per_unit(LLAMA_3_8B.kv_shape.bytes_per_token) == 2048
    assert MODEL_PRESETS["qwen2-7b"].kv_shape.bytes_per_token == 2 * 28 * 4 * 128 * 2
    assert LLAMA_3_70B.kv_shape.bytes_per_token == 2 * 80 * 8 * 128 * 2
    assert 14 < LLAMA_3_8B.weights_gib < 16


def test_kv_space_is_what_weights_and_reserve_leave_of_the_usable_memory():
    plan = _llama_8b_on_a100_80()

    # 80 GiB x 0.9 = 72 GiB usable; 72 - 15 - 2 = 55 GiB of KV cache.
    assert plan.usable_bytes == 72 * GIB
    assert plan.kv_space_bytes == 55 * GIB
    assert plan.unused_bytes == 8 * GIB
    # 720 tokens = 45 blocks of 16 tokens x 128 KiB = 90 MiB a request.
    assert plan.request_kv_bytes == 90 * MIB
    assert plan.concurrent_requests == (55 * 1024) // 90 == 625
    assert plan.fits
    assert plan.kv_tokens == 55 * GIB // (128 * 1024)
    assert plan.kv_space_units == 55 * 4


def test_a_request_reserves_whole_blocks():
    one_more = _llama_8b_on_a100_80(output_tokens=121)

    assert one_more.request_kv_bytes == 46 * 16 * 128 * 1024


def test_the_engine_footprint_matches_the_vllm_flag():
    plan = _llama_8b_on_a100_80()

    assert plan.footprint_units == 72 * GIB // UNIT_BYTES
    assert plan.gpu_memory_utilization == 0.9


def test_room_beyond_vllms_default_sequence_limit_is_flagged():
    assert _llama_8b_on_a100_80().beyond_default_max_num_seqs  # 625 > 256
    assert not _llama_8b_on_a100_80(gpu_memory_gib=24).beyond_default_max_num_seqs


def test_the_alert_line_leaves_fifteen_percent_of_the_kv_space_free():
    plan = _llama_8b_on_a100_80()

    assert plan.requests_below_alert == int(55 * GIB * 0.85) // (90 * MIB)
    assert plan.requests_below_alert < plan.concurrent_requests


def test_a_model_bigger_than_the_card_says_why_it_does_not_fit():
    plan = _llama_8b_on_a100_80(kv_shape=LLAMA_3_70B.kv_shape, weights_gib=131.4)

    assert not plan.fits
    assert plan.concurrent_requests == 0
    assert plan.kv_space_bytes == 0
    assert plan.problem is not None
    assert "no KV space" in plan.problem


def test_tensor_parallel_splits_the_weights_and_adds_up_the_kv_space():
    plan = _llama_8b_on_a100_80(kv_shape=LLAMA_3_70B.kv_shape, weights_gib=132, gpus_per_engine=2)

    # Each card: 72 GiB usable - 66 GiB of weights - 2 GiB reserve = 4 GiB; 8 GiB in all.
    assert plan.weights_bytes == 66 * GIB
    assert plan.engine_kv_bytes == 8 * GIB
    # 720 tokens x 320 KiB = 225 MiB a request.
    assert plan.request_kv_bytes == 225 * MIB
    assert plan.concurrent_requests == 8 * 1024 // 225
    assert plan.fits


def test_a_request_longer_than_the_kv_space_says_so():
    plan = _llama_8b_on_a100_80(prompt_tokens=600_000)

    assert not plan.fits
    assert plan.concurrent_requests == 0
    assert "shorten requests" in (plan.problem or "")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"gpu_memory_gib": 0}, "memory must be positive"),
        ({"utilisation": 0}, "utilisation fraction"),
        ({"utilisation": 1.2}, "utilisation fraction"),
        ({"weights_gib": -1}, "cannot be negative"),
        ({"reserve_gib": -1}, "cannot be negative"),
        ({"gpus_per_engine": 0}, "at least one GPU"),
        ({"prompt_tokens": 0, "output_tokens": 0}, "at least one token"),
    ],
)
def test_impossible_inputs_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        _llama_8b_on_a100_80(**overrides)


@given(
    layers=st.integers(1, 128),
    kv_heads=st.integers(1, 64),
    head_dim=st.sampled_from([64, 80, 96, 128, 256]),
    dtype_bytes=st.sampled_from([1, 2, 4]),
    weights_gib=st.floats(0, 200),
    gpu_memory_gib=st.floats(8, 192),
    utilisation=st.floats(0.05, 1),
    reserve_gib=st.floats(0, 8),
    prompt_tokens=st.integers(0, 200_000),
    output_tokens=st.integers(1, 32_000),
    gpus_per_engine=st.integers(1, 8),
)
def test_the_concurrent_requests_are_exactly_as_many_as_fit(
    layers,
    kv_heads,
    head_dim,
    dtype_bytes,
    weights_gib,
    gpu_memory_gib,
    utilisation,
    reserve_gib,
    prompt_tokens,
    output_tokens,
    gpus_per_engine,
):
    plan = plan_memory(
        kv_shape=KvShape(layers, kv_heads, head_dim, dtype_bytes),
        weights_gib=weights_gib,
        gpu_memory_gib=gpu_memory_gib,
        utilisation=utilisation,
        reserve_gib=reserve_gib,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        gpus_per_engine=gpus_per_engine,
    )

    held = plan.concurrent_requests * plan.request_kv_bytes
    assert held <= plan.engine_kv_bytes < held + plan.request_kv_bytes
    per_card = plan.weights_bytes + plan.reserve_bytes + plan.kv_space_bytes
    assert per_card <= plan.usable_bytes or plan.kv_space_bytes == 0
    assert plan.fits == (plan.concurrent_requests > 0)


def test_per_card_throughput_is_utilisation_times_request_throughput_times_safety():
    assert per_card_qps(
        effective_utilisation=0.5, request_throughput_qps=50, safety_factor=0.8
    ) == pytest.approx(20)


def test_the_seeds_example_needs_a_hundred_cards_seventy_of_them_hot():
    # The seed: about 20 requests a second a card, a daily peak of 2,000 -> 100 cards.
    plan = plan_fleet(
        peak_qps=2000, effective_utilisation=1.0, request_throughput_qps=25, safety_factor=0.8
    )

    assert plan.per_card_qps == pytest.approx(20)
    assert plan.gpus == 100
    assert plan.hot_gpus == 70
    assert plan.cold_gpus == 30
    assert plan.hot_qps == pytest.approx(1400)


def test_cards_round_up_to_whole_engines():
    plan = plan_fleet(
        peak_qps=2000,
        effective_utilisation=1.0,
        request_throughput_qps=25,
        safety_factor=0.8,
        gpus_per_engine=8,
    )

    assert plan.gpus == 104
    assert plan.hot_gpus == 80  # 70% of 104 = 72.8 -> 10 engines of 8
    assert plan.cold_gpus == 24


def test_a_small_load_still_gets_one_card():
    plan = plan_fleet(
        peak_qps=0.5, effective_utilisation=0.7, request_throughput_qps=40, safety_factor=0.8
    )

    assert (plan.gpus, plan.hot_gpus, plan.cold_gpus) == (1, 1, 0)
    assert plan.hot_qps == 0.5


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"peak_qps": 0}, "peak QPS"),
        ({"effective_utilisation": 0}, "effective utilisation"),
        ({"effective_utilisation": 1.5}, "effective utilisation"),
        ({"request_throughput_qps": 0}, "throughput must be positive"),
        ({"safety_factor": 0}, "safety factor"),
        ({"safety_factor": 1.1}, "safety factor"),
        ({"hot_fraction": 0}, "hot fraction"),
        ({"gpus_per_engine": 0}, "at least one GPU"),
    ],
)
def test_impossible_fleet_inputs_are_refused(overrides, message):
    args: dict[str, Any] = {
        "peak_qps": 100,
        "effective_utilisation": 0.7,
        "request_throughput_qps": 40,
        "safety_factor": 0.8,
    }
    args.update(overrides)
    with pytest.raises(ValueError, match=message):
        plan_fleet(**args)


@given(
    peak=st.floats(0.01, 100_000),
    utilisation=st.floats(0.01, 1),
    throughput=st.floats(0.1, 1000),
    safety=st.floats(*SAFETY_FACTOR_RANGE),
    hot_fraction=st.floats(0.05, 1),
    gpus_per_engine=st.integers(1, 8),
)
def test_the_fleet_covers_the_peak_and_the_pools_add_up(
    peak, utilisation, throughput, safety, hot_fraction, gpus_per_engine
):
    plan = plan_fleet(
        peak_qps=peak,
        effective_utilisation=utilisation,
        request_throughput_qps=throughput,
        safety_factor=safety,
        hot_fraction=hot_fraction,
        gpus_per_engine=gpus_per_engine,
    )

    assert plan.gpus * plan.per_card_qps >= peak * (1 - 1e-9)
    assert plan.hot_gpus + plan.cold_gpus == plan.gpus
    assert plan.gpus % gpus_per_engine == plan.hot_gpus % gpus_per_engine == 0
    assert plan.hot_gpus >= min(plan.gpus, plan.gpus * hot_fraction * (1 - 1e-9))
    # One engine fewer than the hot pool would not reach the hot share.
    assert plan.hot_gpus - gpus_per_engine < plan.gpus * hot_fraction
