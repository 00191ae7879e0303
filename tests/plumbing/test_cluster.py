"""Redis Cluster through the hand-written asyncio client (plumbing/aio_redis_cluster.py),
held to redis-py's cluster client on a real cluster of three primaries: the same slot for
every command the platform sends, the same node for every key, and the same values after a
slot moves (MOVED) and while it moves (ASK). Nothing is sent twice and a pipeline never
spans slots."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster as PyRedisCluster

from plumbing.aio_redis_cluster import AsyncRedisCluster
from plumbing.cluster import CrossSlot, Redirect, command_slot, pipeline_slot
from plumbing.raw_redis import RawRedis
from tests.support.redis_cluster import RedisCluster, running_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    with running_cluster(tmp_path_factory.mktemp("cluster")) as started:
        yield started


@pytest.fixture
def model(cluster: RedisCluster) -> Iterator[PyRedisCluster]:
    client = PyRedisCluster.from_url(cluster.url, decode_responses=True)
    client.flushall()  # every primary
    yield client
    client.close()


def run(work: Any) -> Any:
    return asyncio.run(work)


async def _with_client(url: str, work: Any) -> Any:
    client = AsyncRedisCluster(url, max_connections=4, read_timeout_s=5)
    try:
        return await work(client)
    finally:
        client.close()


# The commands the fair queue and the web send, as they send them: a library call with its
# pool's tag, the job's hash and events, a waiter's inbox, a tenant's limits; and the
# commands whose keys follow their count (BLMPOP reads an inbox), routed by those keys.
COMMANDS: list[tuple[Any, ...]] = [
    ("FCALL", "gs_pick", 1, "gs:fq:{p:demo}:pool", "a", "b"),
    ("EVALSHA", "0" * 40, 2, "{t:acme}:rpm", "{t:acme}:tpm", "x"),
    ("HGETALL", "gs:fq:{p:demo}:job:abc"),
    ("HGET", "gs:fq:job:abc", "answered"),
    ("BLPOP", "gs:fq:{p:demo}:inbox:w1", 5),
    ("BLMPOP", 5, 1, "gs:fq:{p:demo}:inbox:w1", "LEFT", "COUNT", 64),
    ("BLMPOP", 0.5, 2, "{p:demo}:a", "{p:demo}:b", "RIGHT"),
    ("BZMPOP", 5, 1, "gs:fq:{p:big pool}:inflight", "MIN"),
    ("LMPOP", 2, "gs:fq:{p:demo}:inbox:w1", "gs:fq:{p:demo}:inbox:w2", "LEFT"),
    ("ZMPOP", 1, "gs:fq:{p:big pool}:inflight", "MAX", "COUNT", 2),
    ("SINTERCARD", 2, "{t:acme}:a", "{t:acme}:b", "LIMIT", 5),
    ("ZINTERCARD", 1, "gs:fq:{p:demo}:waiting"),
    ("MGET", "{t:acme}:a", "{t:acme}:b"),
    ("EXISTS", "gs:fq:job:xyz"),
    ("RPUSH", "gs:fq:loop:t1:wake", "1"),
    ("ZADD", "gs:fq:{p:big pool}:inflight", 1.5, "job"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: f"{c[0]}")
def test_every_command_goes_to_the_slot_redis_py_sends_it_to(model, command):
    assert command_slot(command) == model.determine_slot(*command)


def test_the_thread_client_gives_way_to_redis_pys_cluster_client(model):
    assert RawRedis.like(model) is None


def test_a_command_without_a_key_has_no_slot():
    assert command_slot(("PING",)) is None
    assert command_slot(("FCALL", "f", 0, "arg")) is None
    assert pipeline_slot([("WAIT", 1, 100), ("PING",)]) is None


def test_a_pipeline_across_slots_is_refused_before_anything_is_sent(cluster, model):
    commands = [("SET", "{a}x", "1"), ("SET", "{b}x", "2")]
    with pytest.raises(CrossSlot):
        run(_with_client(cluster.url, lambda c: c.pipeline(commands)))
    assert model.get("{a}x") is None  # nothing ran


def test_keys_land_where_redis_py_puts_them_and_read_back_alike(cluster, model):
    keys = [f"key-{i}" for i in range(60)]  # spread over the three primaries

    async def write(client: AsyncRedisCluster) -> list[Any]:
        for key in keys:
            await client.call("SET", key, key.upper())
        return [await client.call("GET", key) for key in keys]

    assert run(_with_client(cluster.url, write)) == [key.upper().encode() for key in keys]
    assert [model.get(key) for key in keys] == [key.upper() for key in keys]
    for key in keys:  # on the node redis-py names, asked directly (no redirect possible)
        node = model.get_node_from_key(key)
        direct = redis.Redis(host=node.host, port=node.port, decode_responses=True)
        assert direct.execute_command("GET", key, keys=[key]) == key.upper()
    assert len({model.get_node_from_key(key).port for key in keys}) == 3


def test_a_pipeline_on_one_tag_is_one_call_to_its_node(cluster, model):
    commands = [("HSET", "{p:demo}:job:1", "state", "queued"), ("RPUSH", "{p:demo}:q", "1"),
                ("HGET", "{p:demo}:job:1", "state"), ("LLEN", "{p:demo}:q")]  # fmt: skip
    replies = run(_with_client(cluster.url, lambda c: c.pipeline(commands)))
    assert replies == [1, 1, b"queued", 1]
    assert model.hget("{p:demo}:job:1", "state") == "queued"


def test_a_library_loaded_once_is_on_every_primary(cluster, model):
    library = "#!lua name=gs_cluster_test\nredis.register_function('get_it', " \
              "function(keys, args) return redis.call('GET', keys[1]) end)"  # fmt: skip
    keys = [f"lib-{i}" for i in range(30)]
    for key in keys:
        model.set(key, key)

    async def load_and_call(client: AsyncRedisCluster) -> list[Any]:
        assert await client.call("FUNCTION", "LOAD", library) == b"gs_cluster_test"
        return [await client.call("FCALL", "get_it", 1, key) for key in keys]

    assert run(_with_client(cluster.url, load_and_call)) == [key.encode() for key in keys]
    for node in cluster.nodes:
        assert cluster.client(node).execute_command("FUNCTION", "LIST", "LIBRARYNAME",
                                                    "gs_cluster_test")  # fmt: skip
    with pytest.raises(redis.ResponseError, match="already exists"):
        run(_with_client(cluster.url, lambda c: c.call("FUNCTION", "LOAD", library)))


def test_a_slot_that_moved_is_followed_with_its_keys(cluster, model):
    """MOVED: a client whose map predates the move still reads and writes the slot's keys,
    each command run once, and learns the new owner."""
    key = "{moving-1}:job"
    slot = command_slot(("GET", key))
    assert slot is not None
    model.set(key, "before")

    async def scenario(client: AsyncRedisCluster) -> tuple[Any, ...]:
        assert await client.call("GET", key) == b"before"  # the map is read: the old owner
        source = cluster.owner(slot)
        target = next(node for node in cluster.nodes if node is not source)
        cluster.begin_moving(slot, target)
        cluster.move_keys(slot, source, target, [key])
        cluster.finish_moving(slot, target)
        counted = await client.call("INCR", "{moving-1}:count")  # MOVED, then run once
        value = await client.call("GET", key)
        return counted, value, target.port

    counted, value, target_port = run(_with_client(cluster.url, scenario))
    assert (counted, value) == (1, b"before")
    assert model.get("{moving-1}:count") == "1"
    model.nodes_manager.initialize()
    assert model.get_node_from_key(key).port == target_port


def test_a_slot_half_moved_serves_both_halves(cluster, model):
    """ASK: while a slot moves, a key already on the new node is read there (behind ASKING)
    and one not moved yet on the old node; a pipeline of them goes where its keys are."""
    moved, stays = "{half-1}:a", "{half-1}:b"
    slot = command_slot(("GET", moved))
    assert slot is not None
    model.set(moved, "moved")
    model.set(stays, "stays")
    source = cluster.owner(slot)
    target = next(node for node in cluster.nodes if node is not source)

    async def scenario(client: AsyncRedisCluster) -> list[Any]:
        await client.call("PING")  # the map is read before the move starts
        cluster.begin_moving(slot, target)
        cluster.move_keys(slot, source, target, [moved])
        return [
            await client.call("GET", moved),
            await client.call("GET", stays),
            await client.pipeline([("GET", moved), ("STRLEN", moved)]),
        ]

    try:
        assert run(_with_client(cluster.url, scenario)) == [b"moved", b"stays", [b"moved", 5]]
        assert [model.get(moved), model.get(stays)] == ["moved", "stays"]  # redis-py alike
    finally:
        cluster.move_keys(slot, source, target, [stays])
        cluster.finish_moving(slot, target)


def test_blpop_waits_on_the_node_of_its_key(cluster, model):
    key = "{p:demo}:inbox:w1"

    async def pop(client: AsyncRedisCluster) -> Any:
        waiting = asyncio.ensure_future(client.blpop(key, 5))
        await asyncio.sleep(0.2)
        await asyncio.to_thread(model.rpush, key, "event")
        return await waiting

    assert run(_with_client(cluster.url, pop)) == (key.encode(), b"event")


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("MOVED 3999 127.0.0.1:6381", Redirect(False, 3999, "127.0.0.1", 6381)),
        ("ASK 12 10.0.0.2:7000", Redirect(True, 12, "10.0.0.2", 7000)),
        ("3999 127.0.0.1:6381", Redirect(False, 3999, "127.0.0.1", 6381)),  # redis-py's text
        ("ERR unknown command", None),
    ],
)
def test_redirects_are_read_from_either_form(message, expected):
    assert Redirect.parse(message) == expected
