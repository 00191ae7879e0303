"""Charts for the console, drawn on the server as inline SVG. Pure Python: no Django.

The console needs few and simple charts; SVG written here needs no JavaScript library, works
offline, and prints. Functions return markup (well-formed, every label escaped); the caller
marks it safe for its template.
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
