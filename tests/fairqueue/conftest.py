"""Redis fixtures for the fair-queue tests: the real Redis, in a database of their own.

Only that database is flushed. The cluster tests share one Redis Cluster of three primaries
(`cluster`), started once. Override it with GPUSHARE_TEST_FAIRQUEUE_REDIS_URL (not
REDIS_URL, which may point at a database other things are using).
"""

import os
from collections.abc import Iterator

import pytest
import redis

from fairqueue import FairQueue, FairQueueConfig
from tests.support.redis_cluster import RedisCluster, running_cluster

FAIRQUEUE_REDIS_URL = os.environ.get(
    "GPUSHARE_TEST_FAIRQUEUE_REDIS_URL", "redis://127.0.0.1:6379/6"
)


@pytest.fixture
def fq_redis() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(FAIRQUEUE_REDIS_URL, decode_responses=True)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def fq(fq_redis: redis.Redis) -> FairQueue:
    return FairQueue(fq_redis, FairQueueConfig())


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    with running_cluster(tmp_path_factory.mktemp("cluster")) as started:
        yield started
