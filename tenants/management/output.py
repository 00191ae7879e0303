"""Printing command results for people (aligned columns) or scripts (`--json`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.core.management.base import OutputWrapper


def print_json(stdout: OutputWrapper, data: Any) -> None:
    stdout.write(json.dumps(data, indent=2, default=str, sort_keys=False))


def print_table(
    stdout: OutputWrapper, columns: Sequence[str], rows: Sequence[Sequence[Any]]
) -> None:
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [max([len(col), *(len(row[i]) for row in cells)]) for i, col in enumerate(columns)]
    stdout.write("  ".join(col.upper().ljust(w) for col, w in zip(columns, widths, strict=True)))
    for row in cells:
        stdout.write("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    if not rows:
        stdout.write("(none)")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "(all)"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
