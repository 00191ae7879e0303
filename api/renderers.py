"""A CSV renderer, so a report's view answers `?format=csv` (or `Accept: text/csv`) with the
text it built, and JSON otherwise."""

from __future__ import annotations

from typing import Any

from rest_framework.renderers import BaseRenderer


class CsvRenderer(BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        if isinstance(data, str):
            return data.encode()
        # An error's body (a dict): its detail as one line.
        detail = data.get("detail", data) if isinstance(data, dict) else data
        return f"error,{detail}\n".encode()


def wants_csv(request: Any) -> bool:
    renderer = getattr(request, "accepted_renderer", None)
    return getattr(renderer, "format", "") == "csv"
