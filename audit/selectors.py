"""Reading the audit log: filtered, newest first, and as CSV or JSON rows for export."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from audit.models import AuditEvent

EXPORT_COLUMNS = (
    "id",
    "at",
    "actor",
    "via",
    "remote_addr",
    "action",
    "object_type",
    "object_id",
    "object_repr",
    "before",
    "after",
)


def audit_events(
    *,
    actor: str = "",
    action: str = "",
    object_type: str = "",
    object_id: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[AuditEvent]:
    """The events that match every filter given; `action` matches a prefix (`tenant.`
    finds every change of a tenant)."""
    events = AuditEvent.objects.all()
    if actor:
        events = events.filter(actor=actor)
    if action:
        events = events.filter(action__startswith=action)
    if object_type:
        events = events.filter(object_type=object_type)
    if object_id:
        events = events.filter(object_id=object_id)
    if since is not None:
        events = events.filter(at__gte=since)
    if until is not None:
        events = events.filter(at__lt=until)
    return events


def event_row(event: AuditEvent) -> dict[str, Any]:
    return {
        "id": event.pk,
        "at": event.at.isoformat(),
        "actor": event.actor,
        "via": event.via,
        "remote_addr": event.remote_addr,
        "action": event.action,
        "object_type": event.object_type,
        "object_id": event.object_id,
        "object_repr": event.object_repr,
        "before": event.before,
        "after": event.after,
    }


def events_csv(events: Iterable[AuditEvent]) -> str:
    """The events as CSV, `before` and `after` as JSON text in their cells."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(EXPORT_COLUMNS)
    for event in events:
        row = event_row(event)
        writer.writerow(
            [json.dumps(row[c]) if c in ("before", "after") else row[c] for c in EXPORT_COLUMNS]
        )
    return out.getvalue()
