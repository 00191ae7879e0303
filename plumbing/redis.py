"""One Redis connection pool per process, from REDIS_URL, and under Redis Sentinel from the
sentinels (`GPUSHARE_REDIS_SENTINELS`) that say where its primary is. With
`GPUSHARE_REDIS_CLUSTER`, REDIS_URL names one node of a Redis Cluster, and each client
routes every command to the primary that serves its key's slot: redis-py's
`RedisCluster` for threads, `plumbing/aio_redis_cluster.py` for event loops. The callers'
commands are of one slot each, or of keys that share a hash tag.

Under Sentinel, REDIS_URL still gives the database, the user, the password and the TLS
options; its host and port are not used. redis-py's clients come from
`redis.sentinel.Sentinel(...).master_for(...)`, and the hand-written ones
(`plumbing/raw_redis.py`, `plumbing/aio_redis.py`) ask the same sentinels
(`plumbing/sentinel.py`)."""

from functools import cache
from typing import Any, cast
from urllib.parse import quote

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from redis.cluster import RedisCluster
from redis.connection import SSLConnection, parse_url
from redis.sentinel import Sentinel

from plumbing.aio_redis import AsyncRedis
from plumbing.aio_redis_cluster import AsyncRedisCluster
from plumbing.sentinel import Sentinels, parse_sentinels


def sentinels() -> Sentinels | None:
    """The sentinels of the settings; None without Sentinel. A new object each time: each
    client keeps its own order of them (the one that answered first)."""
    addresses = parse_sentinels(settings.GPUSHARE_REDIS_SENTINELS)
    if not addresses:
        return None
    return Sentinels(
        addresses=list(addresses),
        service=settings.GPUSHARE_REDIS_SENTINEL_MASTER,
        password=settings.GPUSHARE_REDIS_SENTINEL_PASSWORD,
        tls=sentinel_tls(settings.REDIS_URL, settings.GPUSHARE_REDIS_SENTINEL_TLS),
    )


def sentinel_tls(url: str, enabled: bool) -> dict[str, Any] | None:
    """The `ssl_*` options the sentinels are reached with (`GPUSHARE_REDIS_SENTINEL_TLS`):
    REDIS_URL's own where it is a rediss:// URL (its CA, client certificate, checks), else
    redis-py's defaults (the certificate required, its name checked, the system's CAs).
    None: plain TCP."""
    if not enabled:
        return None
    return ssl_options(url) or {"ssl_cert_reqs": "required"}


def new_client(url: str, **options: Any) -> redis.Redis:
    """A redis-py client of the Redis at `url` (`options` as `Redis.from_url` takes them);
    under Sentinel, of the primary its sentinels name, with the URL's database, user,
    password and TLS options."""
    if settings.GPUSHARE_REDIS_CLUSTER:
        # It takes the calls the platform makes of a Redis: each of one slot (see above).
        return cast(redis.Redis, RedisCluster.from_url(url, **options))
    found = sentinels()
    if found is None:
        return redis.Redis.from_url(url, **options)
    kwargs: dict[str, Any] = {**parse_url(url), **options}
    for name in ("host", "port", "path"):
        kwargs.pop(name, None)
    if kwargs.pop("connection_class", None) is SSLConnection:
        kwargs["ssl"] = True
    sentinel_kwargs: dict[str, Any] = {k: v for k, v in options.items() if k.startswith("socket_")}
    if found.password:
        sentinel_kwargs["password"] = found.password
    if found.tls is not None:
        sentinel_kwargs.update(ssl=True, **found.tls)
    sentinel = Sentinel(found.addresses, sentinel_kwargs=sentinel_kwargs, **kwargs)
    return sentinel.master_for(found.service, redis_class=redis.Redis)


def close_client(client: redis.Redis) -> None:
    """Closes a client of `new_client`, and under Sentinel its connections to the sentinels."""
    client.close()
    pool = getattr(client, "connection_pool", None)  # a cluster client has one per node
    manager = getattr(pool, "sentinel_manager", None)
    if manager is not None:
        manager.close()


@cache
def _client_for(url: str, sentinel_key: tuple[Any, ...]) -> redis.Redis:
    return new_client(url, decode_responses=True, health_check_interval=30)


def redis_client() -> redis.Redis:
    # Keyed by URL and sentinels so tests that override the settings get their own client.
    key = (
        tuple(settings.GPUSHARE_REDIS_SENTINELS),
        settings.GPUSHARE_REDIS_SENTINEL_MASTER,
        settings.GPUSHARE_REDIS_CLUSTER,
    )
    return _client_for(settings.REDIS_URL, key)


def async_client(*, max_connections: int, read_timeout_s: float) -> AsyncRedis:
    """An event loop's client of REDIS_URL: the hand-written asyncio client, through the
    sentinels under Sentinel; on a cluster its cluster form (`max_connections` per node),
    which takes the same calls."""
    if settings.GPUSHARE_REDIS_CLUSTER:
        cluster = AsyncRedisCluster(
            settings.REDIS_URL, max_connections=max_connections, read_timeout_s=read_timeout_s
        )
        return cast(AsyncRedis, cluster)
    return AsyncRedis(
        settings.REDIS_URL,
        sentinels=sentinels(),
        max_connections=max_connections,
        read_timeout_s=read_timeout_s,
    )


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


def sentinel_broker_url(url: str, addresses: list[str]) -> str:
    """Celery's broker URL for kombu's sentinel transport: each sentinel as
    `sentinel://[user:password@]host:port/db`, separated by `;`, with REDIS_URL's database
    and credentials (kombu takes them from the first). The service's name goes in the
    transport option `master_name`."""
    kwargs = parse_url(url)
    user, password = kwargs.get("username") or "", kwargs.get("password") or ""
    auth = f"{quote(user, safe='')}:{quote(password, safe='')}@" if user or password else ""
    db = int(kwargs.get("db") or 0)
    return ";".join(
        f"sentinel://{auth}{host}:{port}/{db}" for host, port in parse_sentinels(addresses)
    )


def check_cluster_settings(
    *, cluster: bool, redis_url: str, broker_url: str, sentinels: list[str]
) -> None:
    """Refuses settings a Redis Cluster cannot serve: sentinels beside it, a database other
    than 0 (a cluster has none other), or Celery's broker on it (kombu needs one Redis)."""
    if not cluster:
        return
    if sentinels:
        raise ImproperlyConfigured(
            "GPUSHARE_REDIS_CLUSTER and GPUSHARE_REDIS_SENTINELS exclude each other: a "
            "cluster fails over by itself"
        )
    if int(parse_url(redis_url).get("db") or 0) != 0:
        raise ImproperlyConfigured("with GPUSHARE_REDIS_CLUSTER, REDIS_URL must use database 0")
    if broker_url.split(";", 1)[0].strip() == redis_url.strip():
        raise ImproperlyConfigured(
            "with GPUSHARE_REDIS_CLUSTER, set CELERY_BROKER_URL to a Redis (or sentinels) "
            "that is not the cluster: Celery's broker cannot run on a cluster"
        )
