"""The engine agents as the rest of the platform sees them.

Each node's agent (`python -m agent`, agent/) checks in every few seconds with a heartbeat in
Redis; `agent_of` says whether one serves a node. `manage.py engine start|stop` sends its
action to that agent as the console does and follows its progress lines until it is done, so
the agent stays the one process that starts and stops the node's engines, and the command
works from any machine or pod (`kubectl exec deploy/web -- python manage.py engine start
NAME`).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable

from django.conf import settings

from plumbing.errors import DomainError
from plumbing.redis import redis_client
from scheduler import worker_tasks
from scheduler.engines.progress import action_pending, progress_begin, progress_lines
from scheduler.engines.supervisor import EngineStartError
from scheduler.models import Engine, EngineStatus
from scheduler.selectors import engine_get

HEARTBEAT_KEY = "gs:engine-agent:{node}"


def heartbeat_ttl_s(interval_s: float) -> int:
    """A heartbeat outlives a few missed checks (a machine short of CPU), not a dead agent."""
    return max(10, int(interval_s * 3) + 1)


def heartbeat(node: str, interval_s: float) -> None:
    value = {"host": socket.gethostname(), "pid": os.getpid(), "at": time.time()}
    redis_client().set(HEARTBEAT_KEY.format(node=node), json.dumps(value),
                       ex=heartbeat_ttl_s(interval_s))  # fmt: skip


def heartbeat_end(node: str) -> None:
    """The agent is gone: `manage.py engine` runs its actions itself again at once."""
    redis_client().delete(HEARTBEAT_KEY.format(node=node))


def agent_of(node: str) -> dict[str, object] | None:
    """The agent serving the node (its host, pid and last check), or None if none checked
    in lately."""
    raw = redis_client().get(HEARTBEAT_KEY.format(node=node))
    return json.loads(raw) if raw else None


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
    worker_tasks.engine_start(engine.name, engine.device.node)
    timeout_s = float(settings.GPUSHARE_ENGINE_START_TIMEOUT_S) + SLACK_S
    engine = _follow(name, on_progress, timeout_s)
    if engine.status != EngineStatus.READY:
        raise EngineStartError(f"Engine '{name}' is {engine.status}: {engine.status_detail}")
    return engine


def agent_stop(*, name: str, on_progress: Progress) -> Engine:
    """Has the engine's agent drain and stop it."""
    engine = engine_get(name=name)
    progress_begin(name, "stop requested from manage.py")
    worker_tasks.engine_stop(engine.name, engine.device.node)
    timeout_s = (
        float(settings.GPUSHARE_ENGINE_DRAIN_TIMEOUT_S)
        + float(settings.GPUSHARE_ENGINE_STOP_TIMEOUT_S)
        + SLACK_S
    )
    return _follow(name, on_progress, timeout_s)
