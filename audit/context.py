"""Who is acting: the audit log's actor, from the request being served (a staff user in the
console, the admin API or the Django admin) or from a management command's OS user.

A context variable rather than an argument to every service: the services that change
tenants, keys, prices, engines and pools record their changes themselves, and each entry
point says once who acts (`AuditActorMiddleware` for the web, `acting_as` for a command).
The request's user is read when an event is written, not when the request arrives: the admin
API authenticates its token inside the view, after the middleware ran.
"""

from __future__ import annotations

import getpass
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

SYSTEM = "system"


@dataclass(frozen=True)
class Actor:
    name: str
    via: str
    remote_addr: str | None = None


_request: ContextVar[Any] = ContextVar("audit_request", default=None)
_actor: ContextVar[Actor | None] = ContextVar("audit_actor", default=None)


def _via(path: str) -> str:
    if path.startswith("/api/"):
        return "api"
    if path.startswith("/admin/"):
        return "admin"
    if path.startswith("/console/"):
        return "console"
    return "web"


def actor_of_request(request: Any) -> Actor:
    """The request's user (its username; `anonymous` before it logged in) and address."""
    user = getattr(request, "user", None)
    name = user.get_username() if user is not None and user.is_authenticated else "anonymous"
    return Actor(name, _via(request.path), request.META.get("REMOTE_ADDR") or None)


def current_actor() -> Actor:
    """Who acts now: the command's user, else the request's user, else the platform itself."""
    actor = _actor.get()
    if actor is not None:
        return actor
    request = _request.get()
    if request is not None:
        return actor_of_request(request)
    return Actor(SYSTEM, SYSTEM)


@contextmanager
def acting_as(actor: Actor) -> Iterator[None]:
    token = _actor.set(actor)
    try:
        yield
    finally:
        _actor.reset(token)


def command_actor() -> Actor:
    """A management command's actor: the operating system's user that ran it."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for the uid (a container's)
        user = "unknown"
    return Actor(f"cli:{user}", "cli")


@contextmanager
def serving(request: Any) -> Iterator[None]:
    token = _request.set(request)
    try:
        yield
    finally:
        _request.reset(token)
