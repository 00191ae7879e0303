"""The scaler's tasks: the tick (any worker) and one engine of a decision, carried out on the
engine's node by the node's engine agent (agent/main.py), the only consumer of that node's
queue. What they do is `scheduler.pools.scaler`'s."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from celery.signals import celeryd_after_setup
from django.conf import settings

from scheduler.gpu_inventory import node_name
from scheduler.pools import scaler
from scheduler.worker_tasks import node_queue

log = logging.getLogger(__name__)


@celeryd_after_setup.connect
def _consume_node_queue(sender: str, instance: Any, **_: Any) -> None:
    """The node's engine agent takes its node's engine starts and stops; the other workers
    do not, so that a rollout of theirs never stops or strands an engine."""
    if not settings.GPUSHARE_ENGINE_AGENT:
        return
    queue = node_queue(node_name(settings.GPUSHARE_NODE_NAME))
    instance.app.amqp.queues.select_add(queue)
    log.info("worker %s consumes %s", sender, queue)


@shared_task(name="workers.scaler_tick")
def scaler_tick() -> dict[str, str]:
    """Every few seconds: each enabled pool's decision (see scheduler.pools.scaling)."""
    return scaler.scaler_tick()


@shared_task(name="workers.scale_engine")
def scale_engine(decision_id: int, engine: str, action: str) -> str:
    """Carry out one engine of a decision, on the engine's node: start (through warming to
    ready, then it takes picks at once) or drain then stop."""
    return scaler.scale_engine_carry_out(decision_id, engine, action)
