"""Memory-unit arithmetic: rounding directions and conservation (no database)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capacity.units import (
    GIB,
    UNIT_BYTES,
    bytes_to_units_ceil,
    bytes_to_units_exact,
    bytes_to_units_floor,
    device_capacity_units,
    format_units,
    gpu_memory_utilization,
    units_to_bytes,
)

byte_counts = st.integers(min_value=0, max_value=2**50)
unit_counts = st.integers(min_value=0, max_value=2**20)


def test_a_unit_is_256_mib() -> None:
    assert UNIT_BYTES == 256 * 1024 * 1024
    assert bytes_to_units_ceil(GIB) == 4


@given(byte_counts)
def test_a_reservation_rounds_up_and_covers_its_bytes(nbytes: int) -> None:
    units = bytes_to_units_ceil(nbytes)
    assert units_to_bytes(units) >= nbytes
    assert units_to_bytes(units) - nbytes < UNIT_BYTES


@given(byte_counts)
def test_a_capacity_rounds_down_and_never_promises_more_than_it_has(nbytes: int) -> None:
    units = bytes_to_units_floor(nbytes)
    assert units_to_bytes(units) <= nbytes
    assert nbytes - units_to_bytes(units) < UNIT_BYTES
    assert device_capacity_units(nbytes) == units


@given(byte_counts)
def test_ceil_and_floor_differ_by_at_most_one_unit(nbytes: int) -> None:
    diff = bytes_to_units_ceil(nbytes) - bytes_to_units_floor(nbytes)
    assert diff == (0 if nbytes % UNIT_BYTES == 0 else 1)


@given(unit_counts)
def test_whole_units_round_trip_through_bytes(units: int) -> None:
    nbytes = units_to_bytes(units)
    assert bytes_to_units_ceil(nbytes) == units
    assert bytes_to_units_floor(nbytes) == units
    assert bytes_to_units_exact(nbytes) == units


@given(st.lists(byte_counts, max_size=50))
def test_byte_reservations_are_conserved_when_summed(reservations: list[int]) -> None:
    # The scheduler keeps bytes, not units: summing then converting never loses a byte,
    # while summing per-request ceilings may only over-count.
    total = sum(reservations)
    assert bytes_to_units_exact(total) * UNIT_BYTES == pytest.approx(total)
    assert sum(bytes_to_units_ceil(r) for r in reservations) >= bytes_to_units_ceil(total)


@given(st.integers(min_value=1, max_value=4096), st.integers(min_value=1, max_value=2**40))
def test_gpu_memory_utilization_never_claims_more_than_the_units(
    units: int, gpu_bytes: int
) -> None:
    if units_to_bytes(units) > gpu_bytes:
        with pytest.raises(ValueError, match="does not fit"):
            gpu_memory_utilization(footprint_units=units, gpu_memory_bytes=gpu_bytes)
        return
    fraction = gpu_memory_utilization(footprint_units=units, gpu_memory_bytes=gpu_bytes)
    assert 0 <= fraction <= 1
    assert fraction * gpu_bytes <= units_to_bytes(units)


def test_gpu_memory_utilization_of_half_an_80_gib_card() -> None:
    assert gpu_memory_utilization(footprint_units=160, gpu_memory_bytes=80 * GIB) == 0.5


def test_format_units_reads_as_units_and_gib() -> None:
    assert format_units(8) == "8 units = 2.0 GiB"
    assert format_units(1) == "1 unit = 0.25 GiB"
    assert format_units(0.5) == "0.5 units = 0.12 GiB"


@pytest.mark.parametrize(
    "convert", [bytes_to_units_ceil, bytes_to_units_floor, bytes_to_units_exact]
)
def test_negative_bytes_are_refused(convert) -> None:
    with pytest.raises(ValueError, match="negative"):
        convert(-1)
