"""One Redis connection pool per process, from REDIS_URL."""

from functools import cache

import redis
from django.conf import settings


@cache
def _client_for(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True, health_check_interval=30)


def redis_client() -> redis.Redis:
    # Keyed by URL so tests that override REDIS_URL get their own client.
    return _client_for(settings.REDIS_URL)
