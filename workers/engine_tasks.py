"""Celery tasks the console starts engines and stops them with (issue 8).

Starting an engine takes a minute or more and stopping one waits for its drain, longer than
a web request should; the console queues one of these and shows progress by polling the
engine's status and detail (the supervisor writes them), its log and the lines the
supervisor reported here, which live in Redis for an hour.

The process is local to the engine's node, so the console sends these to that node's own
queue (`workers.scaling_tasks.node_queue`), which only the node's engine agent consumes
(`python -m agent`, agent/main.py): the dispatch workers never start, stop or check an
engine's process, so restarting them leaves the engines serving.
"""

from __future__ import annotations

import time

from celery import shared_task

from config.errors import DomainError
from config.redis import redis_client
from scheduler.engines.supervisor import engine_check_unreachable, engine_start, engine_stop
from scheduler.models import Engine, EngineStatus
from scheduler.pools import sync_engine
from workers.scaling_tasks import node_queue

PROGRESS_KEY = "gs:console:engine-progress:{name}"
# Set while a start or stop the console asked for has not finished (the task may still be
# waiting for a worker), so the engine's page keeps following it; the TTL covers a task
# that never ran.
PENDING_KEY = "gs:console:engine-pending:{name}"
PROGRESS_LINES = 40
PROGRESS_TTL_S = 3600


def progress_note(name: str, line: str) -> None:
    key = PROGRESS_KEY.format(name=name)
    stamp = time.strftime("%H:%M:%S", time.gmtime())
    pipe = redis_client().pipeline()
    pipe.rpush(key, f"{stamp} {line}")
    pipe.ltrim(key, -PROGRESS_LINES, -1)
    pipe.expire(key, PROGRESS_TTL_S)
    pipe.execute()


def progress_lines(name: str) -> list[str]:
    """What the last start or stop of the engine reported, oldest first."""
    return [str(line) for line in redis_client().lrange(PROGRESS_KEY.format(name=name), 0, -1)]


def progress_begin(name: str, line: str, *, pending: bool = True) -> None:
    """A new action: its lines replace the previous action's."""
    client = redis_client()
    client.delete(PROGRESS_KEY.format(name=name))
    if pending:
        client.set(PENDING_KEY.format(name=name), 1, ex=PROGRESS_TTL_S)
    progress_note(name, line)


def action_pending(name: str) -> bool:
    return bool(redis_client().exists(PENDING_KEY.format(name=name)))


def _action_done(name: str) -> None:
    redis_client().delete(PENDING_KEY.format(name=name))


@shared_task(name="workers.engine_start")
def start_engine(name: str) -> str:
    """Start the engine and wait until it is ready (or failed, with why in its detail)."""
    try:
        engine = engine_start(name=name, on_progress=lambda line: progress_note(name, line))
    except DomainError as exc:
        progress_note(name, f"start failed: {exc}")
        return "failed"
    finally:
        _action_done(name)
    if engine.status == EngineStatus.READY:
        sync_engine(engine)  # takes picks now, not at the next housekeeping sync
    return str(engine.status)


@shared_task(name="workers.engine_stop")
def stop_engine(name: str) -> str:
    """Drain the engine (its in-flight work ends first) and stop its process."""
    try:
        engine = engine_stop(name=name, on_progress=lambda line: progress_note(name, line))
    except DomainError as exc:
        progress_note(name, f"stop failed: {exc}")
        return "failed"
    finally:
        _action_done(name)
    return str(engine.status)


def send_start(engine: Engine) -> None:
    start_engine.apply_async(args=(engine.name,), queue=node_queue(engine.device.node))


def send_stop(engine: Engine) -> None:
    stop_engine.apply_async(args=(engine.name,), queue=node_queue(engine.device.node))


@shared_task(name="workers.engine_check_unreachable")
def check_unreachable(name: str) -> bool:
    """By the engine's agent: a worker's call could not reach the engine; it is failed and
    out of the picks now if its process is gone (`engine_check_unreachable`)."""
    return engine_check_unreachable(name=name)


# A check nobody took soon says nothing any more: the agent's periodic check has run since.
CHECK_EXPIRES_S = 60


def send_check_unreachable(name: str) -> None:
    node = Engine.objects.filter(name=name).values_list("device__node", flat=True).first()
    if node is not None:
        check_unreachable.apply_async(args=(name,), queue=node_queue(node), expires=CHECK_EXPIRES_S)
