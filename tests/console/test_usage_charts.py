"""The console's server-side SVG charts (pure: no database)."""

import xml.etree.ElementTree as ET

import pytest

from console.charts import Segment, stacked_bar

SVG = "{http://www.w3.org/2000/svg}"


def _segments(markup: str) -> list[float]:
    """Widths of the drawn segments, in the bar's 1000 user units (the first rect is the track)."""
    root = ET.fromstring(markup)
    return [float(r.get("width", 0)) for r in root.iter(f"{SVG}rect")][1:]


def _legend(markup: str) -> list[str]:
    return ["".join(li.itertext()) for li in ET.fromstring(markup).iter("li")]


def test_segments_share_the_bar_in_proportion():
    markup = stacked_bar(
        [Segment("Weights", 15, "#111"), Segment("KV", 45, "#222")], total=80, title="Card"
    )

    assert _segments(markup) == pytest.approx([1000 * 15 / 80, 1000 * 45 / 80])
    assert _legend(markup) == ["Weights (19%)", "KV (56%)"]


def test_an_overfull_bar_is_clipped_to_its_length():
    markup = stacked_bar(
        [Segment("Weights", 130, "#111"), Segment("Reserve", 2, "#222")], total=80, title="Card"
    )

    assert _segments(markup) == [1000]


def test_labels_are_escaped_and_listed_in_the_legend():
    markup = stacked_bar([Segment("<script>", 1, "#111", detail="1 & 2")], title='Quota "acme"')

    root = ET.fromstring(markup)  # still well-formed
    assert _legend(markup) == ["<script>: 1 & 2 (100%)"]
    assert "<script>" not in markup
    title = root.find(f".//{SVG}title")
    assert title is not None
    assert title.text == 'Quota "acme"'


def test_an_empty_bar_draws_no_segments():
    markup = stacked_bar([Segment("Quota", 0, "#111")], title="Nothing")

    assert _segments(markup) == []
    assert _legend(markup) == ["Quota"]


def test_negative_values_are_refused():
    with pytest.raises(ValueError, match="negative"):
        stacked_bar([Segment("x", -1, "#111")], title="Bad")
