"""Tells the audit log which request is being served (`audit.context`). Sync and async
capable: a sync-only middleware would make Django run every async view in a thread."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from audit.context import serving


class AuditActorMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: Any) -> Any:
        if self.is_async:
            return self._acall(request)
        with serving(request):
            return self.get_response(request)

    async def _acall(self, request: Any) -> Any:
        with serving(request):
            response: Awaitable[Any] = self.get_response(request)
            return await response
