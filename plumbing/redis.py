"""One Redis connection pool per process, from REDIS_URL."""

from functools import cache
from typing import Any

import redis
from django.conf import settings
from redis.connection import parse_url


@cache
def _client_for(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True, health_check_interval=30)


def redis_client() -> redis.Redis:
    # Keyed by URL so tests that override REDIS_URL get their own client.
    return _client_for(settings.REDIS_URL)


def ssl_options(url: str) -> dict[str, Any] | None:
    """A rediss:// URL's TLS options as redis-py reads them: the `ssl_*` of its query (its
    own parser), over its default of requiring the server's certificate. None for a URL
    without TLS. For clients that do not read the URL as redis-py does: kombu takes a
    rediss:// URL without `ssl_*` options as one that verifies nothing. Celery's broker may be
    another kind of URL (amqp://, sentinel://), or several separated by `;` that share the
    first one's options, as kombu does."""
    first = url.split(";", 1)[0].strip()
    if not first.lower().startswith("rediss://"):
        return None
    kwargs = parse_url(first)
    options: dict[str, Any] = {"ssl_cert_reqs": "required"}
    options.update((k, v) for k, v in kwargs.items() if k.startswith("ssl_"))
    return options
