"""Management commands that change what the audit log records act as their OS user."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from audit.context import acting_as, command_actor


class AuditedCommand(BaseCommand):
    """A command whose changes are audit events by `cli:<OS user>`."""

    def execute(self, *args: Any, **options: Any) -> Any:
        with acting_as(command_actor()):
            return super().execute(*args, **options)
