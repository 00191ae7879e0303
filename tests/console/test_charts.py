"""The console's SVG charts added for the live pages: unit grids, lines over time, meters."""

import xml.etree.ElementTree as ET

import pytest

from console.charts import (
    Meter,
    Series,
    UnitBlock,
    line_chart,
    meter_chart,
    nice_ceiling,
    unit_grid,
)

SVG = "{http://www.w3.org/2000/svg}"


def _units(markup: str, kind: str) -> list[ET.Element]:
    root = ET.fromstring(markup)
    return [r for r in root.iter(f"{SVG}rect") if r.get("class") == f"unit {kind}"]


def test_a_grid_draws_one_square_per_unit_held_and_free():
    markup = unit_grid(
        [UnitBlock("a", "a", 5, "#111"), UnitBlock("b", "b", 3, "#222")],
        capacity_units=20,
        title="gpu0",
    )

    assert len(_units(markup, "used")) == 8
    assert len(_units(markup, "free")) == 12
    assert [r.get("fill") for r in _units(markup, "used")] == ["#111"] * 5 + ["#222"] * 3


def test_a_grid_wraps_at_32_columns_so_a_big_card_stays_readable():
    markup = unit_grid([UnitBlock("a", "a", 40, "#111")], capacity_units=320, title="A100")

    root = ET.fromstring(markup)
    svg = root.find(f"{SVG}svg")
    assert svg is not None
    assert svg.get("viewBox") == f"0 0 {32 * 14} {10 * 14}"
    squares = _units(markup, "used") + _units(markup, "free")
    assert max(float(r.get("x", 0)) for r in squares) == 31 * 14
    assert len(squares) == 320


def test_units_beyond_the_capacity_are_drawn_as_over_not_as_room():
    markup = unit_grid([UnitBlock("a", "a", 10, "#111")], capacity_units=8, title="small")

    assert len(_units(markup, "used")) == 8
    assert len(_units(markup, "over")) == 2
    assert _units(markup, "free") == []
    assert "over capacity by 2 units" in markup


def test_grid_labels_are_escaped():
    markup = unit_grid(
        [UnitBlock("<x>", "<x>", 1, "#111", detail="a & b")], capacity_units=2, title="t"
    )

    ET.fromstring(markup)
    assert "<x>" not in markup


def test_grids_refuse_negative_units():
    with pytest.raises(ValueError, match="negative"):
        unit_grid([UnitBlock("a", "a", -1, "#111")], capacity_units=4, title="t")


@pytest.mark.parametrize(
    ("value", "top"), [(0, 1), (0.3, 0.5), (1, 1), (3, 5), (7.2, 10), (120, 200), (24, 25)]
)
def test_the_axis_top_is_a_round_number_at_least_the_value(value: float, top: float):
    assert nice_ceiling(value) == pytest.approx(top)


def _polylines(markup: str) -> dict[str, list[list[tuple[float, float]]]]:
    lines: dict[str, list[list[tuple[float, float]]]] = {}
    for line in ET.fromstring(markup).iter(f"{SVG}polyline"):
        points = [tuple(map(float, p.split(","))) for p in line.get("points", "").split()]
        lines.setdefault(line.get("data-series", ""), []).append(points)  # type: ignore[arg-type]
    return lines


def test_a_line_chart_scales_points_into_the_plot_and_draws_a_dashed_limit():
    markup = line_chart(
        [
            Series("reserved", "#111", [(0, 0.0), (50, 4.0), (100, 8.0)]),
            Series("quota", "#c00", [(0, 8.0), (100, 8.0)], dashed=True),
        ],
        title="units",
        since=0,
        until=100,
    )

    lines = _polylines(markup)
    (reserved,) = lines["reserved"]
    assert [x for x, _ in reserved] == [56, 56 + 320, 56 + 640]  # left margin + plot width
    assert [y for _, y in reserved] == [210, 130, 50]  # 0 at the bottom, the axis top is 10
    assert 'stroke-dasharray="6 4"' in markup
    assert lines["quota"] == [[(56, 50), (696, 50)]]


def test_a_gap_in_the_data_is_a_gap_in_the_line():
    markup = line_chart(
        [Series("p99", "#111", [(0, 1.0), (10, None), (20, 2.0), (30, 3.0)])],
        title="latency",
        since=0,
        until=30,
    )

    runs = _polylines(markup)["p99"]
    assert [len(run) for run in runs] == [1, 2]
    assert len(list(ET.fromstring(markup).iter(f"{SVG}circle"))) == 1  # a lone point shows


def test_an_empty_line_chart_says_so():
    markup = line_chart([Series("tokens", "#111", [])], title="t", since=0, until=3600)

    assert "no data in this range" in markup


def test_a_meter_turns_red_past_its_limit():
    markup = meter_chart([Meter("acme", 3, 4), Meter("globex", 6, 4)], title="reserved")

    root = ET.fromstring(markup)
    values = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "value"]
    ticks = [line for line in root.iter(f"{SVG}line") if line.get("class") == "limit"]
    assert [v.get("fill") for v in values] == ["#2f6fb0", "#c0392b"]
    assert [float(v.get("width", 0)) for v in values] == [3 / 10 * 480, 6 / 10 * 480]
    assert {float(t.get("x1", 0)) for t in ticks} == {160 + 4 / 10 * 480}
    assert "6 of 4" in markup  # the numbers beside each bar
