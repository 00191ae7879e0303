"""What the agent does to its node's engines besides the queued starts and stops: the
periodic crash and health check (with a heartbeat that says an agent serves the node), and
the drain of every engine when the agent itself stops where its engines die with it (a
Kubernetes pod, a compose container)."""

from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.db import close_old_connections, connection

from scheduler.engines.agents import heartbeat
from scheduler.engines.supervisor import engine_stop, engines_check_all
from scheduler.models import LIVE_STATUSES, Engine

log = logging.getLogger(__name__)


def check_once(node: str, interval_s: float) -> list[str]:
    """One round: the heartbeat, then every live engine of the node gets the crash check
    and, if ready, /health (`engines_check_all`). Returns the engines failed now."""
    close_old_connections()
    try:
        heartbeat(node, interval_s)
        failed = [engine.name for engine in engines_check_all(node=node)]
    finally:
        connection.close()  # a thread that lives as long as the agent holds none between rounds
    for name in failed:
        log.warning("engine %s is failed", name)
    return failed


def check_in_thread(node: str, stop: threading.Event, interval_s: float) -> threading.Thread:
    def run() -> None:
        while True:
            try:
                check_once(node, interval_s)
            except Exception:  # the database or Redis away: the next round tries again
                log.warning("the engine check failed", exc_info=True)
            if stop.wait(interval_s):
                return

    thread = threading.Thread(target=run, name="engine-check", daemon=True)
    thread.start()
    return thread


def drain_node(node: str) -> list[str]:
    """Drains and stops every live engine of the node (the agent is going, and its engines
    with it); returns their names."""
    close_old_connections()
    names = list(
        Engine.objects.filter(device__node=node, status__in=LIVE_STATUSES)
        .order_by("name")
        .values_list("name", flat=True)
    )
    for name in names:
        log.info("the agent stops: draining engine %s", name)
        try:
            engine_stop(name=name, on_progress=log.info)
        except Exception:  # the next engine still drains
            log.exception("could not stop engine %s", name)
    return names


def check_interval_s() -> float:
    return float(settings.GPUSHARE_AGENT_CHECK_INTERVAL_S)
