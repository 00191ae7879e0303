"""The list pages of the Files and Batches APIs: OpenAI's `after`/`limit` cursor."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from scheduler.batches import files


class PageInput(serializers.Serializer[Any]):
    after = serializers.CharField(required=False, allow_blank=True)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=100, default=20)


def page_body(page: files.Page, render: Any) -> dict[str, Any]:
    data = [render(item) for item in page.items]
    return {
        "object": "list",
        "data": data,
        "has_more": page.has_more,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }
