"""The audit log: one row per change staff made to tenants, keys, quotas, prices, budgets,
engines and pools. Append-only: the model refuses to update or delete a row, and so does
PostgreSQL (a trigger, migration 0001), so neither the ORM nor a stray `queryset.update()`
rewrites what happened."""

from __future__ import annotations

from typing import Any

from django.db import models


class AppendOnly(Exception):
    """An audit event cannot change or go once written."""


class AuditQuerySet(models.QuerySet["AuditEvent"]):
    def update(self, **kwargs: Any) -> int:
        raise AppendOnly("Audit events are append-only: they cannot be updated.")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AppendOnly("Audit events are append-only: they cannot be deleted.")


class AuditEvent(models.Model):
    """Who (`actor`: a staff user's name, `cli:<os user>` for a management command,
    `system` otherwise) did what (`action`, e.g. `tenant.update`) to which object, when,
    from where, and the object's fields before and after (None where it did not exist)."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.CharField(max_length=150, db_index=True)
    via = models.CharField(max_length=16, help_text="console, api, admin, cli or system.")
    remote_addr = models.GenericIPAddressField(null=True, blank=True)
    action = models.CharField(max_length=64, db_index=True)
    object_type = models.CharField(max_length=64, db_index=True)
    object_id = models.CharField(max_length=200, db_index=True)
    object_repr = models.CharField(max_length=200, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)

    objects = AuditQuerySet.as_manager()

    class Meta:
        ordering = ("-at", "-id")
        default_permissions = ("view",)  # nobody changes or deletes an audit event
        indexes = (models.Index(fields=("object_type", "object_id", "at"), name="audit_object"),)

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.object_id}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise AppendOnly("Audit events are append-only: they cannot be updated.")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AppendOnly("Audit events are append-only: they cannot be deleted.")

    @property
    def changed_fields(self) -> list[str]:
        """The fields whose values differ between before and after."""
        before, after = self.before or {}, self.after or {}
        return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
