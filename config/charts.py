"""Charts for the console, drawn on the server as inline SVG. Pure Python: no Django.

The console needs few and simple charts; SVG written here needs no JavaScript library, works
offline, and prints. Functions return SVG markup with every label escaped; the caller marks
it safe for its template.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape


@dataclass(frozen=True)
class Segment:
    label: str
    value: float
    colour: str  # any CSS colour
    detail: str = ""  # shown in the legend and the tooltip, e.g. "15.0 GiB"


def _num(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def stacked_bar_svg(
    segments: Sequence[Segment],
    *,
    total: float | None = None,
    title: str,
    width: int = 640,
    bar_height: int = 28,
) -> str:
    """One horizontal bar split into segments, with a legend underneath.

    `total` is the bar's full length (defaults to the sum); segments beyond it are clipped,
    so an overfull bar still reads as full rather than drawing off the edge.
    """
    if any(s.value < 0 for s in segments):
        raise ValueError("segment values cannot be negative")
    full = total if total is not None else sum(s.value for s in segments)
    legend_row = 20
    height = bar_height + 12 + legend_row * len(segments)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" '
        f'viewBox="0 0 {width} {height}" width="100%" '
        f'preserveAspectRatio="xMinYMin meet">',
        f"<title>{escape(title)}</title>",
        f'<rect x="0" y="0" width="{width}" height="{bar_height}" rx="4" fill="#eef0f3"/>',
    ]
    x = 0.0
    for segment in segments:
        if full <= 0:
            break
        seg_width = min(segment.value / full * width, width - x)
        if seg_width <= 0:
            continue
        tooltip = escape(f"{segment.label}: {segment.detail}" if segment.detail else segment.label)
        parts.append(
            f'<rect x="{_num(x)}" y="0" width="{_num(seg_width)}" height="{bar_height}" '
            f'fill="{escape(segment.colour)}"><title>{tooltip}</title></rect>'
        )
        x += seg_width
    for index, segment in enumerate(segments):
        y = bar_height + 12 + index * legend_row
        share = f" ({segment.value / full:.0%})" if full > 0 else ""
        text = f"{segment.label}: {segment.detail}{share}" if segment.detail else segment.label
        parts.append(
            f'<rect x="0" y="{y}" width="12" height="12" rx="2" fill="{escape(segment.colour)}"/>'
            f'<text x="18" y="{y + 10}" font-size="13" fill="#1f2933">{escape(text)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
