"""Redis Sentinel through the hand-written clients (plumbing/raw_redis.py, aio_redis.py),
held to redis-py's: the same primary found by the same sentinels, and the same behaviour when
a failover moves it (a connection to a server that went away, or to a primary demoted to a
replica, is a ConnectionError; the next call goes to the primary the sentinels name then),
against real redis-server processes. They never send a command twice: redis-py here runs
without its retries, to compare like with like.

Also the fence (`WAIT` behind a write, plumbing/sentinel.py) and the settings that turn
Sentinel on for every client and for Celery's broker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel

from plumbing.aio_redis import AsyncRedis
from plumbing.raw_redis import RawRedis
from plumbing.sentinel import Fence, NotReplicated, Sentinels, parse_sentinels, sentinels_of
from tests.support.certificates import Certificates, make_certificates
from tests.support.harness import free_port
from tests.support.redis_sentinel import MASTER, RedisNode, SentinelGroup


def _started(workdir: Path, tls: Certificates | None = None) -> Iterator[SentinelGroup]:
    started = SentinelGroup(workdir, tls=tls)
    try:
        started.start()
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelGroup]:
    """A group the tests leave as they found it (its sentinels take seconds to meet)."""
    yield from _started(tmp_path_factory.mktemp("sentinel"))


@pytest.fixture(scope="module")
def tls_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelGroup]:
    """Sentinels that serve their clients over TLS (`localhost`'s certificate, from a CA of
    the test)."""
    workdir = tmp_path_factory.mktemp("sentinel-tls")
    yield from _started(workdir, make_certificates(workdir))


@pytest.fixture
def fresh_group(tmp_path: Path) -> Iterator[SentinelGroup]:
    """A group of the test's own, to fail over."""
    yield from _started(tmp_path)


def clients(group: SentinelGroup, db: int = 3) -> tuple[redis.Redis, RawRedis, AsyncRedis]:
    """redis-py's client of the primary (no retries), ours made like it, and the asyncio one."""
    sentinel = Sentinel([n.address for n in group.sentinels], socket_timeout=2)
    model = sentinel.master_for(
        MASTER, db=db, decode_responses=True, retry=Retry(NoBackoff(), 0), socket_timeout=5
    )
    raw = RawRedis.like(model)
    assert raw is not None
    found = Sentinels([n.address for n in group.sentinels], MASTER)
    aio = AsyncRedis(group.url(db), max_connections=4, read_timeout_s=5, sentinels=found)
    return model, raw, aio


def test_sentinels_are_read_as_host_port_items() -> None:
    assert parse_sentinels(["a:1", " b:26380 ", "c", "[::1]:5"]) == (
        ("a", 1), ("b", 26380), ("c", 26379), ("::1", 5),
    )  # fmt: skip
    with pytest.raises(ValueError, match="host:port"):
        parse_sentinels(["a:b"])


def test_the_primary_is_the_one_redis_py_finds(group: SentinelGroup) -> None:
    dead = ("127.0.0.1", free_port())  # a sentinel that is down is passed over
    addresses = [dead, *(n.address for n in group.sentinels)]
    ours = Sentinels(list(addresses), MASTER, timeout_s=1)
    theirs = Sentinel(list(addresses), socket_timeout=1)
    expected = theirs.discover_master(MASTER)
    assert expected == group.servers[0].address
    assert ours.master() == expected
    assert asyncio.run(ours.master_async()) == expected
    # The sentinel that answered is asked first from then on, as in redis-py.
    assert ours.addresses[0] == group.sentinels[0].address
    first = theirs.sentinels[0].connection_pool.connection_kwargs
    assert (first["host"], first["port"]) == ours.addresses[0]


def test_an_unknown_service_is_master_not_found_as_in_redis_py(group: SentinelGroup) -> None:
    addresses = [n.address for n in group.sentinels]
    with pytest.raises(MasterNotFoundError):
        Sentinel(addresses, socket_timeout=1).discover_master("nobody")
    ours = Sentinels(list(addresses), "nobody", timeout_s=1)
    with pytest.raises(MasterNotFoundError):
        ours.master()
    with pytest.raises(MasterNotFoundError):
        asyncio.run(ours.master_async())


def test_our_client_made_like_a_sentinel_one_asks_its_sentinels(group: SentinelGroup) -> None:
    sentinel = Sentinel([n.address for n in group.sentinels], sentinel_kwargs={"password": ""})
    model = sentinel.master_for(MASTER, db=2, decode_responses=True)
    found = sentinels_of(model)
    assert found is not None
    assert (found.addresses, found.service) == ([n.address for n in group.sentinels], MASTER)
    raw = RawRedis.like(model)
    assert raw is not None
    assert raw.sentinels is not None
    assert raw.db == 2
    raw.call("SET", "k", "v")
    assert model.get("k") == "v"
    assert (raw.host, raw.port) == group.servers[0].address


def write_until_it_lands(call: Callable[[], Any], tries: int = 40) -> tuple[list[str], Any]:
    """Calls until one succeeds; what each failed try raised, and the answer."""
    failures: list[str] = []
    for _ in range(tries):
        try:
            return failures, call()
        except redis.ConnectionError as exc:
            failures.append(type(exc).__name__)
            asyncio.run(asyncio.sleep(0.25))
    raise AssertionError(f"never landed: {failures}")


def test_after_the_primary_dies_every_client_writes_to_the_promoted_replica(
    fresh_group: SentinelGroup,
) -> None:
    group = fresh_group
    model, raw, aio = clients(group)
    loop = asyncio.new_event_loop()
    try:
        for name, call in [
            ("redis-py", lambda: model.incr("count:redis-py")),
            ("raw", lambda: raw.call("INCR", "count:raw")),
            ("aio", lambda: loop.run_until_complete(aio.call("INCR", "count:aio"))),
        ]:
            assert call() == 1, name
        old = group.servers[0].address
        group.servers[0].kill()
        new = group.wait_for_new_master(old)
        assert new == group.servers[1].address
        landed = {}
        for name, call in [
            ("redis-py", lambda: model.incr("count:redis-py")),
            ("raw", lambda: raw.call("INCR", "count:raw")),
            ("aio", lambda: loop.run_until_complete(aio.call("INCR", "count:aio"))),
        ]:
            failures, answer = write_until_it_lands(call)
            # The first write was replicated before the kill: the second lands once, on the
            # promoted replica (a failed try ran nowhere).
            landed[name] = (answer, failures)
        assert {name: answer for name, (answer, _) in landed.items()} == {
            "redis-py": 2, "raw": 2, "aio": 2,
        }  # fmt: skip
        assert (raw.host, raw.port) == new
        promoted = redis.Redis(port=new[1], db=3, decode_responses=True)
        assert promoted.mget("count:redis-py", "count:raw", "count:aio") == ["2", "2", "2"]
        print(f"tries that failed before the write landed: {landed}")
    finally:
        aio.close()
        loop.close()


class _Pointed(Sentinels):
    """Sentinels that name `self.primary`: a demotion the test makes itself."""

    primary: tuple[str, int] = ("127.0.0.1", 0)

    def master(self) -> tuple[str, int]:
        return self.primary

    async def master_async(self) -> tuple[str, int]:
        return self.primary


class _PointedSentinel(Sentinel):
    primary: tuple[str, int] = ("127.0.0.1", 0)

    def discover_master(self, service_name: str) -> tuple[str, int]:
        return self.primary


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[RedisNode, RedisNode]]:
    nodes = (RedisNode(tmp_path, "a"), RedisNode(tmp_path, "b"))
    try:
        for node in nodes:
            node.start("--port", str(node.port), "--bind", "127.0.0.1", "--save", "")
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def test_a_demoted_primary_s_readonly_is_a_connection_error_and_the_next_call_moves(
    pair: tuple[RedisNode, RedisNode],
) -> None:
    a, b = pair
    theirs = _PointedSentinel([("127.0.0.1", 1)])
    theirs.primary = a.address
    model = theirs.master_for(MASTER, decode_responses=True, retry=Retry(NoBackoff(), 0))
    raw = RawRedis.like(model)
    assert raw is not None
    ours = _Pointed([("127.0.0.1", 1)], MASTER)
    raw.sentinels = ours
    ours.primary = a.address
    aio = AsyncRedis(f"redis://127.0.0.1:{a.port}/0", max_connections=2, read_timeout_s=5,
                     sentinels=ours)  # fmt: skip
    loop = asyncio.new_event_loop()
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("redis-py", lambda: model.incr("n:redis-py")),
        ("raw", lambda: raw.call("INCR", "n:raw")),
        ("aio", lambda: loop.run_until_complete(aio.call("INCR", "n:aio"))),
    ]
    try:
        assert [call() for _, call in calls] == [1, 1, 1]
        # b is promoted, a follows it: a's clients stay connected, and a refuses writes.
        redis.Redis(port=b.port).replicaof("NO", "ONE")
        redis.Redis(port=a.port).replicaof("127.0.0.1", b.port)
        ours.primary = theirs.primary = b.address
        for name, call in calls:
            with pytest.raises(redis.ConnectionError, match="previous master is now a slave"):
                call()
            assert call() == 1, name  # on b, where nothing ran: the refused write ran nowhere
        assert redis.Redis(port=b.port).mget("n:redis-py", "n:raw", "n:aio") == [b"1"] * 3
    finally:
        aio.close()
        loop.close()


def test_the_fence_counts_the_replicas_that_have_the_write(group: SentinelGroup) -> None:
    _, raw, aio = clients(group)
    loop = asyncio.new_event_loop()
    try:
        one, two = Fence(1, 2000), Fence(2, 200)
        assert raw.call("SET", "f", "1", fence=one) == "OK"
        assert loop.run_until_complete(aio.call("SET", "f", "2", fence=one)) == b"OK"
        with pytest.raises(NotReplicated) as short:
            raw.call("INCR", "g", fence=two)  # one replica: never two
        assert (short.value.answer, short.value.acked, short.value.wanted) == (1, 1, 2)
        assert isinstance(short.value, redis.ConnectionError)
        with pytest.raises(NotReplicated) as short:
            loop.run_until_complete(aio.call("INCR", "g", fence=two))
        assert short.value.answer == 2
        # The write stands on the primary: only its replication is in doubt.
        assert raw.call("GET", "g") == "2"
    finally:
        aio.close()
        loop.close()


def test_the_settings_put_every_client_and_celerys_broker_on_the_sentinels(
    group: SentinelGroup, settings: Any
) -> None:
    from plumbing.redis import (
        close_client,
        new_client,
        redis_client,
        sentinel_broker_url,
        sentinels,
    )

    settings.REDIS_URL = "redis://:pw@nowhere.invalid:1/5"
    settings.GPUSHARE_REDIS_SENTINELS = group.sentinel_addresses
    settings.GPUSHARE_REDIS_SENTINEL_MASTER = MASTER
    found = sentinels()
    assert found is not None
    assert found.master() == group.servers[0].address
    settings.REDIS_URL = "redis://127.0.0.1:1/5"
    client = redis_client()
    assert client.connection_pool.connection_kwargs["db"] == 5
    client.set("through-sentinel", "1")
    assert redis.Redis(port=group.servers[0].port, db=5).get("through-sentinel") == b"1"
    fresh = new_client(settings.REDIS_URL, socket_timeout=1)
    assert fresh.ping()
    close_client(fresh)  # the readiness check's: nothing stays open to the sentinels
    sentinel_links = fresh.connection_pool.sentinel_manager.sentinels  # type: ignore[attr-defined]
    pools = [link.connection_pool for link in sentinel_links]
    assert any(pool._available_connections for pool in pools)  # it asked them
    assert all(c._sock is None for pool in pools for c in pool._available_connections)
    raw = RawRedis.like(client)
    assert raw is not None
    assert raw.sentinels is not None
    url = sentinel_broker_url("redis://u:p%40ss@x:1/4", ["h1:1", "h2"])
    assert url == "sentinel://u:p%40ss@h1:1/4;sentinel://u:p%40ss@h2:26379/4"


def test_celery_s_broker_is_kombu_s_sentinel_transport(group: SentinelGroup) -> None:
    from kombu import Connection

    from plumbing.redis import sentinel_broker_url

    url = sentinel_broker_url("redis://127.0.0.1:1/7", group.sentinel_addresses)
    primary = redis.Redis(port=group.servers[0].port, db=7)
    with Connection(url, transport_options={"master_name": MASTER}) as connection:
        queue = connection.SimpleQueue("sentinel-test")
        queue.put({"hello": "world"})
        assert primary.llen("sentinel-test") == 1  # on the primary, in REDIS_URL's database
        message = queue.get(timeout=5)
        assert message.payload == {"hello": "world"}
        message.ack()
        queue.close()


def test_sentinels_over_tls_name_the_primary_redis_py_names(tls_group: SentinelGroup) -> None:
    group, addresses = tls_group, tls_group.sentinel_addresses_by_name()
    options = group.tls_options()
    expected = group.sentinel().discover_master(MASTER)
    assert expected == group.servers[0].address
    ours = Sentinels(list(addresses), MASTER, timeout_s=2, tls=options)
    assert ours.master() == expected
    assert asyncio.run(ours.master_async()) == expected
    # Plain TCP, or a certificate of another CA: neither client finds it.
    assert group.tls is not None
    stranger = {"ssl_ca_certs": str(group.tls.stranger_ca), "ssl_cert_reqs": "required"}
    for tls in (None, stranger):
        theirs_kwargs: dict[str, Any] = {"socket_timeout": 1}
        if tls is not None:
            theirs_kwargs.update(ssl=True, **tls)
        with pytest.raises(MasterNotFoundError):
            Sentinel(list(addresses), sentinel_kwargs=theirs_kwargs).discover_master(MASTER)
        with pytest.raises(MasterNotFoundError):
            Sentinels(list(addresses), MASTER, timeout_s=1, tls=tls).master()
        with pytest.raises(MasterNotFoundError):
            asyncio.run(Sentinels(list(addresses), MASTER, timeout_s=1, tls=tls).master_async())


def test_every_client_reaches_the_primary_through_sentinels_over_tls(
    tls_group: SentinelGroup,
) -> None:
    group = tls_group
    model = group.sentinel().master_for(MASTER, db=4, decode_responses=True)
    found = sentinels_of(model)
    assert found is not None
    assert found.tls == group.tls_options()
    raw = RawRedis.like(model)
    assert raw is not None
    raw.call("SET", "over-tls", "raw")
    assert model.get("over-tls") == "raw"
    aio = AsyncRedis(group.url(4), max_connections=2, read_timeout_s=5, sentinels=found)

    async def through_aio() -> Any:
        await aio.call("SET", "over-tls", "aio")
        try:
            return await aio.call("GET", "over-tls")
        finally:
            aio.close()

    assert asyncio.run(through_aio()) == b"aio"


def test_the_settings_reach_the_sentinels_and_celerys_broker_over_tls(
    tls_group: SentinelGroup, settings: Any
) -> None:
    from kombu import Connection

    from plumbing.redis import new_client, sentinel_broker_url, sentinel_tls, sentinels

    group = tls_group
    assert group.tls is not None
    ca = group.tls.ca
    settings.GPUSHARE_REDIS_SENTINELS = [f"localhost:{n.port}" for n in group.sentinels]
    settings.GPUSHARE_REDIS_SENTINEL_MASTER = MASTER
    settings.GPUSHARE_REDIS_SENTINEL_TLS = True
    # REDIS_URL's TLS options are the sentinels' too.
    settings.REDIS_URL = f"rediss://localhost:1/6?ssl_ca_certs={ca}"
    found = sentinels()
    assert found is not None
    assert found.tls == {"ssl_cert_reqs": "required", "ssl_ca_certs": str(ca)}
    assert found.master() == group.servers[0].address
    settings.GPUSHARE_REDIS_SENTINEL_TLS = False
    assert sentinels().tls is None  # type: ignore[union-attr]
    # A redis:// REDIS_URL: redis-py's defaults, which a certificate of the test's CA fails.
    assert sentinel_tls("redis://x:1/0", True) == {"ssl_cert_reqs": "required"}
    assert sentinel_tls("redis://x:1/0", False) is None
    settings.GPUSHARE_REDIS_SENTINEL_TLS = True
    settings.REDIS_URL = "redis://localhost:1/6"  # plain servers, sentinels over TLS
    with pytest.raises(MasterNotFoundError):
        new_client(settings.REDIS_URL, socket_timeout=1).ping()
    # Celery's broker: kombu's sentinel transport with the sentinel_kwargs the settings make.
    url = sentinel_broker_url("redis://127.0.0.1:1/7", settings.GPUSHARE_REDIS_SENTINELS)
    options = {"master_name": MASTER, "sentinel_kwargs": {"ssl": True, **group.tls_options()}}
    with Connection(url, transport_options=options) as connection:
        queue = connection.SimpleQueue("sentinel-tls-test")
        queue.put({"over": "tls"})
        message = queue.get(timeout=5)
        assert message.payload == {"over": "tls"}
        message.ack()
        queue.close()
