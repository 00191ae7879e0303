"""Placement by units, first-fit decreasing, and dedicated-engine quota (no database)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capacity.placement import (
    DedicatedQuotaError,
    DeviceRoom,
    EngineDemand,
    PlacementError,
    check_dedicated_quota,
    check_fits_device,
    choose_device,
    place_engines,
    plan_placement,
    request_quota_units,
)


def test_biggest_engines_are_placed_first_on_the_first_device_with_room() -> None:
    devices = [DeviceRoom("gpu0", 10), DeviceRoom("gpu1", 10)]
    engines = [EngineDemand("a", 3), EngineDemand("b", 7), EngineDemand("c", 4)]
    plan = place_engines(engines, devices)
    # b (7) -> gpu0, c (4) -> gpu1, a (3) -> gpu0: first-fit decreasing fills both exactly.
    assert plan.assignments == {"b": "gpu0", "c": "gpu1", "a": "gpu0"}
    assert plan.free_units == {"gpu0": 0, "gpu1": 6}


def test_first_fit_decreasing_fits_what_arrival_order_would_not() -> None:
    devices = [DeviceRoom("gpu0", 6), DeviceRoom("gpu1", 6)]
    engines = [EngineDemand("small1", 2), EngineDemand("small2", 2), EngineDemand("big", 6)]
    plan = place_engines(engines, devices)
    assert plan.assignments["big"] == "gpu0"
    assert plan.assignments["small1"] == plan.assignments["small2"] == "gpu1"


def test_units_already_held_on_a_device_are_respected() -> None:
    devices = [DeviceRoom("gpu0", 8, used_units=6), DeviceRoom("gpu1", 8)]
    assert choose_device(EngineDemand("new", 3), devices) == "gpu1"


def test_it_refuses_what_does_not_fit_and_says_which_device_is_short_by_how_much() -> None:
    devices = [DeviceRoom("node1/gpu0", 8, used_units=5), DeviceRoom("node1/gpu1", 8, 4)]
    with pytest.raises(PlacementError) as refused:
        place_engines([EngineDemand("llama", 6)], devices)
    message = str(refused.value)
    assert "engine 'llama' needs 6 units = 1.5 GiB" in message
    assert "node1/gpu1, has 4 of 8 units free and is short by 2 units" in message
    assert refused.value.refusals[0].engine == "llama"


def test_a_plan_places_what_fits_and_lists_the_rest() -> None:
    plan = plan_placement([EngineDemand("big", 9), EngineDemand("ok", 4)], [DeviceRoom("gpu0", 8)])
    assert plan.assignments == {"ok": "gpu0"}
    assert [r.engine for r in plan.refusals] == ["big"]
    assert not plan.complete


def test_without_devices_it_says_there_is_no_device() -> None:
    with pytest.raises(PlacementError, match="there is no device"):
        place_engines([EngineDemand("a", 1)], [])


def test_an_engine_of_zero_units_is_refused() -> None:
    with pytest.raises(PlacementError, match="at least 1 unit"):
        place_engines([EngineDemand("a", 0)], [DeviceRoom("gpu0", 8)])


def test_a_pinned_device_must_have_room() -> None:
    check_fits_device(EngineDemand("a", 8), DeviceRoom("cpu0", 8))
    with pytest.raises(PlacementError, match=r"short by 1 unit$"):
        check_fits_device(EngineDemand("a", 9), DeviceRoom("cpu0", 8))


@given(
    capacities=st.lists(st.integers(min_value=0, max_value=64), max_size=6),
    demands=st.lists(st.integers(min_value=1, max_value=64), max_size=12),
)
def test_no_device_is_ever_given_more_than_its_capacity(
    capacities: list[int], demands: list[int]
) -> None:
    devices = [DeviceRoom(f"gpu{i}", c) for i, c in enumerate(capacities)]
    engines = [EngineDemand(f"e{i}", u) for i, u in enumerate(demands)]
    plan = plan_placement(engines, devices)
    for device in devices:
        placed = sum(
            u
            for name, u in ((e.name, e.units) for e in engines)
            if plan.assignments.get(name) == device.key
        )
        assert placed <= device.capacity_units
        assert plan.free_units[device.key] == device.capacity_units - placed
    # Every engine is either placed or refused, never both or neither.
    refused = {r.engine for r in plan.refusals}
    assert refused.isdisjoint(plan.assignments)
    assert refused | set(plan.assignments) == {e.name for e in engines}
    # A refused engine really did not fit anywhere at its turn: none fits in what is left
    # for the biggest refused one either.
    for refusal in plan.refusals:
        assert all(free < refusal.units for free in plan.free_units.values())


def test_dedicated_engines_count_against_the_tenant_quota() -> None:
    check_dedicated_quota(tenant="acme", quota_units=16, dedicated_units_held=8, new_units=8)
    with pytest.raises(DedicatedQuotaError, match="over quota by 4 units"):
        check_dedicated_quota(tenant="acme", quota_units=16, dedicated_units_held=12, new_units=8)


def test_dedicated_engines_leave_the_rest_of_the_quota_for_requests() -> None:
    assert request_quota_units(quota_units=16, dedicated_units=6) == 10
    assert request_quota_units(quota_units=4, dedicated_units=6) == 0
