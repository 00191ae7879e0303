"""The audit log in the Django admin (read only), and the mixin that makes the admin's forms
write it."""

from __future__ import annotations

from typing import Any, TypeVar

from django.contrib import admin
from django.db import models
from django.http import HttpRequest

from audit.context import actor_of_request
from audit.models import AuditEvent
from audit.services import audit_record, snapshot

_M = TypeVar("_M", bound=models.Model)


class AuditedAdmin(admin.ModelAdmin[_M]):
    """A ModelAdmin whose adds, changes and deletes are audit events
    (`<model>.create|update|delete`), with the row before and after."""

    def save_model(self, request: HttpRequest, obj: _M, form: Any, change: bool) -> None:
        before = snapshot(type(obj)._default_manager.filter(pk=obj.pk).first()) if change else None
        super().save_model(request, obj, form, change)
        verb = "update" if change else "create"
        audit_record(
            action=f"{_name(obj)}.{verb}",
            instance=obj,
            before=before,
            after=snapshot(obj),
            actor=actor_of_request(request),
        )

    def delete_model(self, request: HttpRequest, obj: _M) -> None:
        before, pk = snapshot(obj), str(obj.pk)
        super().delete_model(request, obj)
        audit_record(
            action=f"{_name(obj)}.delete",
            object_type=_name(obj),
            object_id=pk,
            before=before,
            actor=actor_of_request(request),
        )

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for obj in queryset:
            self.delete_model(request, obj)


def _name(obj: models.Model) -> str:
    return obj._meta.model_name or type(obj).__name__.lower()


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin[AuditEvent]):
    list_display = ("at", "actor", "via", "remote_addr", "action", "object_type", "object_id")
    list_filter = ("via", "object_type", "action")
    search_fields = ("actor", "object_id", "object_repr", "action")
    date_hierarchy = "at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
