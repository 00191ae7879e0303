"""Charts for the console, drawn on the server as inline SVG. Pure Python: no Django.

The console needs few and simple charts; SVG written here needs no JavaScript library, works
offline, and prints. Functions return markup (well-formed, every label escaped); the caller
marks it safe for its template.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape


@dataclass(frozen=True)
class Segment:
    label: str
    value: float
    colour: str  # any CSS colour
    detail: str = ""  # shown in the legend and the tooltip, e.g. "15.0 GiB"


# The bar's length in SVG user units; it is stretched to the page's width.
_WIDTH = 1000


def _num(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def stacked_bar(
    segments: Sequence[Segment],
    *,
    total: float | None = None,
    title: str,
    bar_height: int = 24,
) -> str:
    """One horizontal bar split into segments (SVG), with a legend underneath (HTML).

    The bar stretches to its container's width while its height and the legend's text keep
    their size. `total` is the bar's full length (defaults to the sum); segments beyond it
    are clipped, so an overfull bar still reads as full rather than drawing off the edge.
    """
    if any(s.value < 0 for s in segments):
        raise ValueError("segment values cannot be negative")
    full = total if total is not None else sum(s.value for s in segments)
    parts = [
        '<figure class="bar-chart">',
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" '
        f'aria-label="{escape(title)}" viewBox="0 0 {_WIDTH} {bar_height}" width="100%" '
        f'height="{bar_height}" preserveAspectRatio="none">',
        f"<title>{escape(title)}</title>",
        f'<rect x="0" y="0" width="{_WIDTH}" height="{bar_height}" fill="#eef0f3"/>',
    ]
    x = 0.0
    for segment in segments:
        if full <= 0:
            break
        seg_width = min(segment.value / full * _WIDTH, _WIDTH - x)
        if seg_width <= 0:
            continue
        parts.append(
            f'<rect x="{_num(x)}" y="0" width="{_num(seg_width)}" height="{bar_height}" '
            f'fill="{escape(segment.colour)}"><title>{escape(_caption(segment, full))}</title>'
            "</rect>"
        )
        x += seg_width
    parts.append('</svg><figcaption><ul class="legend">')
    for segment in segments:
        parts.append(
            f'<li><span class="swatch" style="background:{escape(segment.colour)}"></span>'
            f"{escape(_caption(segment, full))}</li>"
        )
    parts.append("</ul></figcaption></figure>")
    return "".join(parts)


def _caption(segment: Segment, full: float) -> str:
    detail = f": {segment.detail}" if segment.detail else ""
    share = f" ({segment.value / full:.0%})" if full > 0 else ""
    return f"{segment.label}{detail}{share}"


# --- the unit grid: one device's memory, one square per 256 MiB unit --------------------


@dataclass(frozen=True)
class UnitBlock:
    """Units one engine holds on a device, drawn as a run of squares in one colour."""

    key: str  # what the squares are tagged with (data-engine), e.g. the engine's name
    label: str
    units: int
    colour: str
    detail: str = ""


_CELL = 14  # a unit's square (12 px) and the gap after it (2 px)


def unit_grid(blocks: Sequence[UnitBlock], *, capacity_units: int, title: str) -> str:
    """A device as a grid of squares, one per unit: each block's units in its colour, in the
    order given, then the free units in grey. Units past the capacity (an overcommitted
    device) are drawn in red after the last row, so they cannot be mistaken for room.

    Squares are tagged `class="unit used|free|over"` and `data-engine`, so tests and people
    can count them. The legend is HTML under the SVG."""
    if capacity_units < 0 or any(b.units < 0 for b in blocks):
        raise ValueError("units cannot be negative")
    used = sum(b.units for b in blocks)
    drawn = max(capacity_units, used)
    columns = max(1, min(32, drawn))
    rows = -(-drawn // columns) if drawn else 1
    width, height = columns * _CELL, rows * _CELL
    free = max(0, capacity_units - used)
    parts = [
        '<figure class="unit-grid">',
        f'<svg xmlns="http://www.w3.org/2000/svg" class="grid" role="img" '
        f'aria-label="{escape(title)}" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}">',
        f"<title>{escape(title)}</title>",
    ]
    cell = 0

    def square(css: str, colour: str) -> str:
        x, y = (cell % columns) * _CELL, (cell // columns) * _CELL
        return (
            f'<rect class="unit {css}" x="{x}" y="{y}" width="{_CELL - 2}" '
            f'height="{_CELL - 2}" rx="2" fill="{escape(colour)}"/>'
        )

    for block in blocks:
        parts.append(
            f'<g data-engine="{escape(block.key)}"><title>{escape(_block_caption(block))}</title>'
        )
        for _ in range(block.units):
            over = cell >= capacity_units
            parts.append(square("over" if over else "used", "#c0392b" if over else block.colour))
            cell += 1
        parts.append("</g>")
    if free:
        parts.append(f"<g><title>{free} free unit{'s' if free != 1 else ''}</title>")
        for _ in range(free):
            parts.append(square("free", "#e4e7eb"))
            cell += 1
        parts.append("</g>")
    parts.append('</svg><figcaption><ul class="legend">')
    for block in blocks:
        parts.append(
            f'<li><span class="swatch" style="background:{escape(block.colour)}"></span>'
            f"{escape(_block_caption(block))}</li>"
        )
    parts.append(
        f'<li><span class="swatch" style="background:#e4e7eb"></span>free: {free} of '
        f"{capacity_units} units</li>"
    )
    if used > capacity_units:
        parts.append(
            '<li><span class="swatch" style="background:#c0392b"></span>'
            f"over capacity by {used - capacity_units} units</li>"
        )
    parts.append("</ul></figcaption></figure>")
    return "".join(parts)


def _block_caption(block: UnitBlock) -> str:
    detail = f" ({block.detail})" if block.detail else ""
    return f"{block.label}: {block.units} unit{'s' if block.units != 1 else ''}{detail}"


# --- lines over time -------------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    """One line: points (x, y) with x in seconds since the epoch; y None leaves a gap."""

    label: str
    colour: str
    points: Sequence[tuple[float, float | None]]
    dashed: bool = False


_LEFT, _RIGHT, _TOP, _BOTTOM = 56, 14, 10, 26


def nice_ceiling(value: float) -> float:
    """The axis top for `value`: 1, 2, 2.5 or 5 times a power of ten, at least `value`."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value - 1e-12:
            return float(step * power)
    return float(10 * power)  # pragma: no cover - the loop ends at 10


def _axis_label(value: float) -> str:
    """Short enough for the axis: 950, 1.5k, 1.8M."""
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{_num(value / scale)}{suffix}"
    return _num(value)


def _time_label(moment: float, span_s: float) -> str:
    stamp = datetime.fromtimestamp(moment, tz=UTC)
    return stamp.strftime("%H:%M") if span_s <= 2 * 86400 else stamp.strftime("%m-%d")


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    unit: str = "",
    since: float,
    until: float,
    plot_width: int = 640,
    plot_height: int = 200,
) -> str:
    """Lines over [since, until] (seconds since the epoch, shown in UTC) on a shared y axis
    from 0 to a round top; a dashed series is a limit (a quota line). An empty chart still
    draws its axes and says there is no data. Drawn at its natural size (text stays
    readable), shrunk to fit a narrower container but never stretched."""
    if until <= since:
        raise ValueError("the chart's end must be after its start")
    values = [y for s in series for _, y in s.points if y is not None]
    top = nice_ceiling(max(values, default=0.0))
    width, height = _LEFT + plot_width + _RIGHT, _TOP + plot_height + _BOTTOM
    x_ticks = 5 if plot_width >= 400 else 3

    def px(x: float) -> float:
        return _LEFT + (x - since) / (until - since) * plot_width

    def py(y: float) -> float:
        return _TOP + plot_height - min(y, top) / top * plot_height

    parts = [
        '<figure class="line-chart">',
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" '
        f'aria-label="{escape(title)}" viewBox="0 0 {width} {height}" width="{width}">',
        f"<title>{escape(title)}</title>",
    ]
    for i in range(5):
        y = top * i / 4
        parts.append(
            f'<line x1="{_LEFT}" x2="{_LEFT + plot_width}" y1="{_num(py(y))}" y2="{_num(py(y))}" '
            f'stroke="#dde1e6" stroke-width="1"/>'
            f'<text x="{_LEFT - 6}" y="{_num(py(y) + 4)}" text-anchor="end" font-size="11" '
            f'fill="#5f6b7a">{escape(_axis_label(y))}{escape(unit)}</text>'
        )
    for i in range(x_ticks):
        x = since + (until - since) * i / (x_ticks - 1)
        anchor = "start" if i == 0 else "end" if i == x_ticks - 1 else "middle"
        parts.append(
            f'<text x="{_num(px(x))}" y="{height - 8}" text-anchor="{anchor}" font-size="11" '
            f'fill="#5f6b7a">{escape(_time_label(x, until - since))}</text>'
        )
    for s in series:
        for run in _runs(s.points):
            coords = " ".join(f"{_num(px(x))},{_num(py(y))}" for x, y in run)
            dash = ' stroke-dasharray="6 4"' if s.dashed else ""
            parts.append(
                f'<polyline class="series" data-series="{escape(s.label)}" fill="none" '
                f'stroke="{escape(s.colour)}" stroke-width="2"{dash} points="{coords}">'
                f"<title>{escape(s.label)}</title></polyline>"
            )
            if len(run) == 1:
                x, y = run[0]
                parts.append(
                    f'<circle cx="{_num(px(x))}" cy="{_num(py(y))}" r="3" '
                    f'fill="{escape(s.colour)}"/>'
                )
    if not values:
        parts.append(
            f'<text x="{_LEFT + plot_width / 2}" y="{_TOP + plot_height / 2}" text-anchor="middle" '
            f'font-size="13" fill="#5f6b7a">no data in this range</text>'
        )
    parts.append('</svg><figcaption><ul class="legend">')
    for s in series:
        style = "dashed" if s.dashed else "solid"
        parts.append(
            f'<li><span class="swatch line {style}" style="border-color:{escape(s.colour)}">'
            f"</span>{escape(s.label)}</li>"
        )
    parts.append("</ul></figcaption></figure>")
    return "".join(parts)


def _runs(
    points: Sequence[tuple[float, float | None]],
) -> list[list[tuple[float, float]]]:
    """The points split where y is None, so a gap in the data is a gap in the line."""
    runs: list[list[tuple[float, float]]] = [[]]
    for x, y in sorted(points, key=lambda p: p[0]):
        if y is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append((x, y))
    return [run for run in runs if run]


# --- values against their limits: one bar per row -------------------------------------


@dataclass(frozen=True)
class Meter:
    label: str
    value: float
    limit: float
    detail: str = ""


def meter_chart(meters: Sequence[Meter], *, title: str, colour: str = "#2f6fb0") -> str:
    """One horizontal bar per row on a shared scale, each with a dark tick at its limit
    (a reservation against its quota): a bar past its tick is over the limit."""
    if any(m.value < 0 or m.limit < 0 for m in meters):
        raise ValueError("meter values cannot be negative")
    top = nice_ceiling(max([m.value for m in meters] + [m.limit for m in meters], default=0))
    label_w, bar_w, row_h, caption_w = 160, 480, 26, 340
    width, height = label_w + bar_w + caption_w, max(1, len(meters)) * row_h + 4
    parts = [
        '<figure class="meter-chart">',
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" '
        f'aria-label="{escape(title)}" viewBox="0 0 {width} {height}" width="{width}">',
        f"<title>{escape(title)}</title>",
    ]
    for i, meter in enumerate(meters):
        y = i * row_h + 4
        over = meter.value > meter.limit
        fill = "#c0392b" if over else colour
        bar = meter.value / top * bar_w
        tick = label_w + meter.limit / top * bar_w
        caption = meter.detail or f"{_num(meter.value)} of {_num(meter.limit)}"
        parts.append(
            f'<g class="meter" data-label="{escape(meter.label)}">'
            f"<title>{escape(meter.label)}: {escape(caption)}</title>"
            f'<text x="{label_w - 8}" y="{y + 15}" text-anchor="end" font-size="12" '
            f'fill="#1f2933">{escape(meter.label)}</text>'
            f'<rect x="{label_w}" y="{y}" width="{bar_w}" height="18" fill="#eef0f3"/>'
            f'<rect class="value" x="{label_w}" y="{y}" width="{_num(bar)}" height="18" '
            f'fill="{fill}"/>'
            f'<line class="limit" x1="{_num(tick)}" x2="{_num(tick)}" y1="{y - 2}" '
            f'y2="{y + 20}" stroke="#1f2933" stroke-width="2"/>'
            f'<text x="{label_w + bar_w + 10}" y="{y + 14}" font-size="12" '
            f'fill="#5f6b7a">{escape(caption)}</text></g>'
        )
    parts.append("</svg></figure>")
    return "".join(parts)
