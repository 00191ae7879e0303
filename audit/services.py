"""Writing the audit log: `audit_record`, called by every service that changes tenants,
keys, quotas, prices, budgets, engines and pools, and by the few entry points that change
them without a service (the Django admin's forms)."""

from __future__ import annotations

import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from audit.context import Actor, current_actor
from audit.models import AuditEvent

# Fields never copied into the log: secrets' digests, and bookkeeping that every save moves.
_LEFT_OUT = frozenset({"hashed_key", "updated_at", "last_used_at"})


def snapshot(instance: models.Model | None) -> dict[str, Any] | None:
    """The instance's concrete fields as JSON values (a foreign key as its id), secrets left
    out; None for no instance."""
    if instance is None:
        return None
    values: dict[str, Any] = {}
    for field in instance._meta.concrete_fields:
        if field.name in _LEFT_OUT:
            continue
        values[field.attname] = getattr(instance, field.attname)
    # Through JSON once, so dates, decimals and UUIDs read back as the log stores them.
    loaded: dict[str, Any] = json.loads(json.dumps(values, cls=DjangoJSONEncoder))
    return loaded


def audit_record(
    *,
    action: str,
    instance: models.Model | None = None,
    object_type: str = "",
    object_id: str = "",
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    actor: Actor | None = None,
) -> AuditEvent:
    """One event in the log, by the current actor (`audit.context`) unless one is given.
    The object is `instance` (its model's name and primary key) or the type and id given;
    `before` and `after` are `snapshot`s. Written in the caller's transaction: a change
    that rolls back leaves no event."""
    actor = actor or current_actor()
    if instance is not None:
        object_type = object_type or instance._meta.model_name or ""
        object_id = object_id or str(instance.pk)
    return AuditEvent.objects.create(
        actor=actor.name[:150],
        via=actor.via,
        remote_addr=actor.remote_addr,
        action=action,
        object_type=object_type,
        object_id=object_id,
        object_repr=str(instance)[:200] if instance is not None else object_id[:200],
        before=before,
        after=after,
    )
