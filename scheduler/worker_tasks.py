"""The worker tasks the web, the feeder and the commands start, by name.

A task is sent by its registered name (Celery's `send_task`), so the code that sends one
imports nothing of the worker processes (`workers/` imports this package, never the other
way round). Each name here is a task that a module of `workers/` registers under it
(`@shared_task(name=...)`); tests/workers/test_task_names.py checks each is registered and
takes the arguments sent here.
"""

from __future__ import annotations

from celery import current_app

DISPATCH = "workers.dispatch"
PROCESS_BATCH = "workers.batch_process"
ENGINE_START = "workers.engine_start"
ENGINE_STOP = "workers.engine_stop"
ENGINE_CHECK_UNREACHABLE = "workers.engine_check_unreachable"
SCALE_ENGINE = "workers.scale_engine"

UNREACHABLE_CHECK_EXPIRES_S = 60

NAMES = (DISPATCH, PROCESS_BATCH, ENGINE_START, ENGINE_STOP, ENGINE_CHECK_UNREACHABLE, SCALE_ENGINE)


def node_queue(node: str) -> str:
    """The queue of one node's engine starts and stops: the engines' processes live there."""
    return f"gpushare.node.{node}"


def dispatch(pool: str) -> None:
    """Starts (or nudges) a worker's picker for `pool`."""
    current_app.send_task(DISPATCH, args=(pool,))


def process_batch(batch_pk: int, *, countdown: float | None = None) -> None:
    """Has a worker validate, feed or finalize the batch (after `countdown` seconds)."""
    current_app.send_task(PROCESS_BATCH, args=(batch_pk,), countdown=countdown)


def engine_start(name: str, node: str) -> None:
    current_app.send_task(ENGINE_START, args=(name,), queue=node_queue(node))


def engine_stop(name: str, node: str) -> None:
    current_app.send_task(ENGINE_STOP, args=(name,), queue=node_queue(node))


def engine_check_unreachable(name: str, node: str) -> None:
    """Has the engine's agent fail it now if its process is gone: a call could not reach it,
    and only the agent sees the process. A check nobody took within a minute says nothing
    any more: the agent's periodic check has run since."""
    current_app.send_task(
        ENGINE_CHECK_UNREACHABLE,
        args=(name,),
        queue=node_queue(node),
        expires=UNREACHABLE_CHECK_EXPIRES_S,
    )


def scale_engine(decision_id: int, engine: str, node: str, action: str, *, expires: float) -> None:
    current_app.send_task(
        SCALE_ENGINE, args=(decision_id, engine, action), queue=node_queue(node), expires=expires
    )
