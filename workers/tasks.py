"""Celery tasks. Each takes ids, calls a service and returns nothing worth keeping."""

from celery import shared_task

from config.redis import redis_client

PING_KEY = "gpushare:worker-ping:{token}"


@shared_task(name="workers.ping")
def ping(token: str) -> None:
    """Leave a mark in Redis, so a caller can see that a worker runs tasks end to end."""
    redis_client().set(PING_KEY.format(token=token), "pong", ex=60)
