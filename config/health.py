"""/healthz (the process is alive) and /readyz (database and Redis answer, an engine is ready).

`/readyz?exclude=engines` leaves checks out (comma-separated or repeated, as Kubernetes' own
API server reads it): the web pods' readiness probe asks only for the database and Redis
(platform/k8s/base/web.yaml says why). An unknown name is refused (400), so that a probe
with a typo fails instead of checking less than it says.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from plumbing.redis import close_client, new_client


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _check_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def _check_redis() -> None:
    # A fresh short-timeout client: a pooled one could hang for its socket timeout.
    timeout = settings.GPUSHARE_READY_TIMEOUT_S
    client = new_client(settings.REDIS_URL, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        client.ping()
        if settings.GPUSHARE_REDIS_CLUSTER:  # a node answers; the cluster must serve all slots
            state = client.execute_command("CLUSTER INFO").get("cluster_state")
            if state != "ok":
                raise ConnectionError(f"the Redis Cluster's state is {state!r}")
    finally:
        close_client(client)


class NoReadyEngine(Exception):
    pass


def _check_engines() -> None:
    from scheduler.models import Engine, EngineStatus  # apps are loaded by request time

    if not Engine.objects.filter(status=EngineStatus.READY).exists():
        raise NoReadyEngine("no engine is ready (manage.py engine status)")


READINESS_CHECKS: dict[str, Callable[[], None]] = {
    "database": _check_database,
    "redis": _check_redis,
    "engines": _check_engines,
}


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    excluded = {name for value in request.GET.getlist("exclude") for name in value.split(",")}
    unknown = sorted(excluded - set(READINESS_CHECKS))
    if unknown:
        error = f"unknown check(s): {', '.join(unknown)}; known: {', '.join(READINESS_CHECKS)}"
        return JsonResponse({"status": "bad request", "error": error}, status=400)
    checks: dict[str, dict[str, object]] = {}
    for name, check in READINESS_CHECKS.items():
        if name in excluded:
            continue
        try:
            check()
        except Exception as exc:  # any failure means "not ready"; say which and why
            checks[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        else:
            checks[name] = {"ok": True}
    ready = all(result["ok"] for result in checks.values())
    failing = [name for name, result in checks.items() if not result["ok"]]
    body = {"status": "ready" if ready else "not ready", "failing": failing, "checks": checks}
    return JsonResponse(body, status=200 if ready else 503)
