"""The online path on a Redis Cluster of three primaries: the official `openai` client -> web
-> fair queue (the pool's keys in one slot, each tenant's quota lease and limits in slots of
their own, on other primaries) -> a real Celery worker (its broker a Redis of its own) -> the
real vLLM CPU engine, and back (`GPUSHARE_REDIS_CLUSTER`, plumbing/redis.py)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from redis.cluster import RedisCluster as PyRedisCluster
from redis.crc import key_slot

from fairqueue.keys import Keys
from tests.e2e.conftest import MODEL, make_tenant
from tests.e2e.test_online import client_for, scheduler_check, usage_rows, wait_for
from tests.support.harness import Database, Platform, free_port, start_engine_through_agent
from tests.support.redis_cluster import RedisCluster, running_cluster

# Celery's broker: a Redis database no other platform of the session uses.
BROKER_URL = os.environ.get("GPUSHARE_E2E_CLUSTER_BROKER_URL", "redis://127.0.0.1:6379/13")
ENGINE = MODEL  # its served model and pool are named as it is


@pytest.fixture(scope="module")
def cluster_platform(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Platform, RedisCluster]]:
    model_dir = Path(os.environ.get("GPUSHARE_DEMO_MODEL_DIR", "var/models/tiny-llama"))
    if not (model_dir / "config.json").exists():
        pytest.fail(f"The tiny model is missing at {model_dir}: run `make test` first.")
    workdir = tmp_path_factory.mktemp("on-cluster")
    with running_cluster(workdir / "redis") as cluster:
        database = Database(os.environ.get("DATABASE_URL", ""), workdir)
        redis.Redis.from_url(BROKER_URL).flushdb()
        platform = Platform(workdir, database_url=database.url, redis_url=cluster.url)
        platform.env.update({"GPUSHARE_REDIS_CLUSTER": "1", "CELERY_BROKER_URL": BROKER_URL})
        try:
            platform.start()
            platform.manage("gpus", "discover")
            platform.manage(
                "engine", "create", ENGINE, "--units", "4", "--port", str(free_port()),
                "--max-model-len", "4096", "--max-num-seqs", "8",
            )  # fmt: skip
            start_engine_through_agent(platform, ENGINE, timeout=600)
            platform.wait_http("/readyz", timeout=30)  # the cluster's state included
            yield platform, cluster
        finally:
            try:
                platform.manage("engine", "stop", ENGINE, timeout=120)
            except Exception as exc:  # stopping is best effort; the result stands
                print(f"engine stop failed: {exc}")
            platform.stop()
            database.drop()


def test_requests_of_two_tenants_run_through_a_cluster_and_are_counted_once(
    cluster_platform: tuple[Platform, RedisCluster],
) -> None:
    platform, cluster = cluster_platform
    # Limits and a budget: the admission counts them in the tenant's slot (its budget seeded).
    tenants = [make_tenant(platform, rpm="100", token_budget="100000") for _ in range(2)]
    answers: dict[str, list[Any]] = {slug: [] for slug, _ in tenants}
    failures: list[BaseException] = []

    def ask(slug: str, key: str, i: int) -> None:
        client = client_for(platform, key)
        try:
            if i % 2:  # streamed: granted to the web, which calls the engine itself
                chunks = list(
                    client.chat.completions.create(
                        model=MODEL, max_tokens=8, stream=True,
                        messages=[{"role": "user", "content": f"tell me {i}"}],
                        stream_options={"include_usage": True},
                    )
                )  # fmt: skip
                answers[slug].append(chunks[-1].usage)
            else:
                chat = client.chat.completions.create(
                    model=MODEL, max_tokens=8, messages=[{"role": "user", "content": f"hi {i}"}]
                )
                answers[slug].append(chat.usage)
        except BaseException as exc:  # reported below, with the platform's logs
            failures.append(exc)

    threads = [
        threading.Thread(target=ask, args=(slug, key, i)) for slug, key in tenants for i in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not failures, f"{failures!r}\n{platform.logs()}"
    for slug, _ in tenants:
        assert len(answers[slug]) == 6
        assert all(usage is not None and usage.completion_tokens > 0 for usage in answers[slug])
        rows = wait_for(lambda s=slug: (r := usage_rows(platform, s)) and len(r) == 6 and r)
        assert {row["outcome"] for row in rows} == {"success"}
        assert sorted(row["completion_tokens"] for row in rows) == sorted(
            usage.completion_tokens for usage in answers[slug]
        )
    assert "no drift" in scheduler_check(platform)
    assert httpx.get(f"{platform.base_url}/readyz", timeout=10).status_code == 200

    # The keys are where the layout puts them: the pool's under its tag, each tenant's lease
    # and limits under theirs, spread over the primaries.
    nodes = PyRedisCluster.from_url(cluster.url, decode_responses=True)
    try:
        keys = Keys()
        slug = tenants[0][0]
        lease = nodes.hgetall(keys.lease(ENGINE, slug))
        assert int(lease["held"]) == 0 < int(lease["leased"])
        assert nodes.exists(keys.lease_quota(slug))
        pool_slot = key_slot(keys.pool_tag(ENGINE).encode())
        tenant_slots = {key_slot(keys.lease_quota(s).encode()) for s, _ in tenants}
        assert pool_slot not in tenant_slots
    finally:
        nodes.close()
