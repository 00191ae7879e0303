"""`manage.py engine start|stop` through the engine's agent: where an agent serves the
engine's node (its heartbeat is fresh), the command sends the action to it as the console
does and follows its progress lines until it is done, so the agent stays the one process
that starts and stops the node's engines, and the command works from any machine or pod
(`kubectl exec deploy/web -- python manage.py engine start NAME`)."""

from __future__ import annotations

import time
from collections.abc import Callable

from django.conf import settings

from agent.engines import agent_of
from config.errors import DomainError
from scheduler.engines.supervisor import EngineStartError
from scheduler.models import Engine, EngineStatus
from scheduler.selectors import engine_get
from workers.engine_tasks import (
    action_pending,
    progress_begin,
    progress_lines,
    send_start,
    send_stop,
)

Progress = Callable[[str], None]
POLL_S = 1.0
# Beyond the action's own timeouts: the agent may be busy with another start.
SLACK_S = 120.0


class AgentActionTimeout(DomainError):
    http_status = 504
    code = "engine_agent_timeout"


def agent_serves(name: str) -> bool:
    """An engine agent checked in lately on the engine's node."""
    return agent_of(engine_get(name=name).device.node) is not None


def _follow(name: str, on_progress: Progress, timeout_s: float) -> Engine:
    """Writes the action's progress lines as they come, until the agent has done it."""
    written: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while True:
        done = not action_pending(name)
        for line in progress_lines(name):
            if line not in written:
                written.add(line)
                on_progress(line)
        if done:
            return engine_get(name=name)
        if time.monotonic() > deadline:
            raise AgentActionTimeout(
                f"The engine agent did not finish with '{name}' within {timeout_s:.0f} s; "
                "see its log."
            )
        time.sleep(POLL_S)


def agent_start(*, name: str, on_progress: Progress) -> Engine:
    """Has the engine's agent start it; returns it ready, or raises with its failure."""
    engine = engine_get(name=name)
    progress_begin(name, "start requested from manage.py")
    send_start(engine)
    timeout_s = float(settings.GPUSHARE_ENGINE_START_TIMEOUT_S) + SLACK_S
    engine = _follow(name, on_progress, timeout_s)
    if engine.status != EngineStatus.READY:
        raise EngineStartError(f"Engine '{name}' is {engine.status}: {engine.status_detail}")
    return engine


def agent_stop(*, name: str, on_progress: Progress) -> Engine:
    """Has the engine's agent drain and stop it."""
    engine = engine_get(name=name)
    progress_begin(name, "stop requested from manage.py")
    send_stop(engine)
    timeout_s = (
        float(settings.GPUSHARE_ENGINE_DRAIN_TIMEOUT_S)
        + float(settings.GPUSHARE_ENGINE_STOP_TIMEOUT_S)
        + SLACK_S
    )
    return _follow(name, on_progress, timeout_s)
