"""The telemetry arithmetic, without services."""

import math

import pytest

from telemetry.smoothing import (
    Load,
    Point,
    bucket_start,
    counter_increase,
    downsample,
    engine_load,
    ewma,
    interval_mean,
)


def test_the_first_sample_is_the_average():
    assert ewma(None, 70.0, 5.0, 30.0) == 70.0


def test_after_one_time_constant_the_average_moved_63_percent():
    assert ewma(0.0, 100.0, 30.0, 30.0) == pytest.approx(100 * (1 - math.exp(-1)))


def test_a_one_sample_spike_barely_moves_a_smoothed_utilisation():
    assert ewma(10.0, 100.0, 1.0, 30.0) < 15.0


def test_a_late_sample_weighs_more_than_a_prompt_one():
    assert ewma(0.0, 100.0, 20.0, 30.0) > ewma(0.0, 100.0, 5.0, 30.0)


def test_load_is_the_largest_signal_and_names_it():
    assert engine_load(kv_cache_usage=0.7, reserved_fraction=0.5, tensor_activity=0.3) == Load(
        0.7, "kv_cache_usage"
    )
    assert engine_load(kv_cache_usage=0.1, reserved_fraction=0.5, tensor_activity=0.9) == Load(
        0.9, "tensor_activity"
    )


def test_load_without_a_gpu_leaves_the_gpu_out_rather_than_counting_it_idle():
    assert engine_load(kv_cache_usage=0.2, reserved_fraction=0.6, tensor_activity=None) == Load(
        0.6, "reserved_fraction"
    )


def test_load_is_clamped_to_0_1_and_zero_without_any_signal():
    assert engine_load(kv_cache_usage=None, reserved_fraction=None, tensor_activity=None) == Load(
        0.0, ""
    )
    assert engine_load(kv_cache_usage=None, reserved_fraction=1.4, tensor_activity=None).value == 1


def test_a_counter_increase_survives_a_reset():
    assert counter_increase(None, 5) == 0
    assert counter_increase(5, 8) == 3
    assert counter_increase(8, 2) == 2  # the engine restarted


def test_interval_mean_of_a_histogram():
    assert interval_mean(1.0, 10, 3.0, 14) == pytest.approx(0.5)
    assert interval_mean(1.0, 10, 1.0, 10) is None  # nothing observed
    assert interval_mean(None, None, 3.0, 14) is None  # no baseline
    assert interval_mean(5.0, 20, 1.0, 2) is None  # restarted


def test_buckets_start_on_their_boundary():
    assert bucket_start(125.0, 60) == 120.0
    assert bucket_start(3599.9, 3600) == 0.0


def test_downsampling_means_each_field_per_bucket_weighted_by_samples():
    points = [
        Point(at=0, values={"u": 10.0}),
        Point(at=30, values={"u": 20.0}),
        Point(at=59, values={"u": 60.0}, samples=2),  # an average of two samples already
        Point(at=61, values={"u": 5.0}),
    ]
    first, second = downsample(points, 60)
    assert (first.at, first.samples) == (0, 4)
    assert first.values["u"] == pytest.approx((10 + 20 + 60 * 2) / 4)
    assert (second.at, second.samples, second.values["u"]) == (60, 1, 5.0)


def test_downsampling_keeps_absent_fields_absent_and_ignores_gaps_in_means():
    points = [
        Point(at=0, values={"u": None, "t": 40.0}),
        Point(at=10, values={"u": None, "t": None}),
        Point(at=20, values={"u": None, "t": 50.0}),
    ]
    (bucket,) = downsample(points, 60)
    assert bucket.values == {"t": 45.0, "u": None}
    assert bucket.samples == 3
