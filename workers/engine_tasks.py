"""Celery tasks the console starts engines and stops them with (`scheduler.worker_tasks`).

The process is local to the engine's node, so the console sends these to that node's own
queue (`scheduler.worker_tasks.node_queue`), which only the node's engine agent consumes
(`python -m agent`, agent/main.py): the dispatch workers never start, stop or check an
engine's process, so restarting them leaves the engines serving. Progress goes to
`scheduler.engines.progress`, which the console's engine page reads.
"""

from __future__ import annotations

from celery import shared_task

from plumbing.errors import DomainError
from scheduler.engines.progress import action_done, progress_note
from scheduler.engines.supervisor import engine_check_unreachable, engine_start, engine_stop
from scheduler.models import EngineStatus
from scheduler.pools.policies import sync_engine
from scheduler.worker_tasks import (
    ENGINE_CHECK_UNREACHABLE,
    ENGINE_START,
    ENGINE_STOP,
    SCALE_ENGINE,
)


@shared_task(name=ENGINE_START)
def start_engine(name: str) -> str:
    """Start the engine and wait until it is ready (or failed, with why in its detail)."""
    try:
        engine = engine_start(name=name, on_progress=lambda line: progress_note(name, line))
    except DomainError as exc:
        progress_note(name, f"start failed: {exc}")
        return "failed"
    finally:
        action_done(name)
    if engine.status == EngineStatus.READY:
        sync_engine(engine)  # takes picks now, not at the next housekeeping sync
    return str(engine.status)


@shared_task(name=ENGINE_STOP)
def stop_engine(name: str) -> str:
    """Drain the engine (its in-flight work ends first) and stop its process."""
    try:
        engine = engine_stop(name=name, on_progress=lambda line: progress_note(name, line))
    except DomainError as exc:
        progress_note(name, f"stop failed: {exc}")
        return "failed"
    finally:
        action_done(name)
    return str(engine.status)


@shared_task(name=ENGINE_CHECK_UNREACHABLE)
def check_unreachable(name: str) -> bool:
    """By the engine's agent: a worker's call could not reach the engine; it is failed and
    out of the picks now if its process is gone (`engine_check_unreachable`)."""
    return engine_check_unreachable(name=name)


# The tasks the node's engine agent runs, and the only ones (agent/tasks_allowed.py): those
# sent to a node's queue, the engine starts, stops and checks, and the scaler's starts and
# drains (workers/scaling_tasks.py).
AGENT_TASKS = frozenset({ENGINE_START, ENGINE_STOP, ENGINE_CHECK_UNREACHABLE, SCALE_ENGINE})
