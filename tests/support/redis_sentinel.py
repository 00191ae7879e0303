"""A Redis primary, its replica and three sentinels, as real redis-server processes on free
ports, for the tests of failover (tests/plumbing/test_sentinel.py,
tests/reliability/test_redis_failover.py).

Each server keeps an AOF in a folder of its own, as in production. The sentinels watch the
primary under `MASTER` with a quorum of 2, call it down after `DOWN_AFTER_MS` without an
answer, and promote the replica. A server that was killed starts again as a replica of the
primary the sentinels name then, as a deployment's start script does (Bitnami's chart asks
the sentinels before it starts Redis).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import redis
from redis.sentinel import MasterNotFoundError, Sentinel

from tests.support.certificates import Certificates
from tests.support.harness import free_port

MASTER = "mymaster"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 4000


class RedisNode:
    """One redis-server (a data server or a sentinel) in a folder of its own."""

    def __init__(self, workdir: Path, name: str) -> None:
        self.name = name
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def start(self, *args: str, client: redis.Redis | None = None) -> None:
        """Starts it and waits until it answers (`client`: how to reach it, when it serves
        TLS)."""
        log = open(self.dir / "redis.log", "ab")  # noqa: SIM115 - lives with the process
        self.process = subprocess.Popen(
            ["redis-server", *args], cwd=self.dir, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        client = client or redis.Redis(port=self.port)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if client.ping():
                    return
            except (redis.ConnectionError, redis.BusyLoadingError):
                time.sleep(0.05)
        raise AssertionError(f"{self.name} on {self.port} did not answer")

    def kill(self) -> None:
        """SIGKILL: no shutdown save, no goodbye to the replica or the sentinels."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


class SentinelGroup:
    """A primary, one replica and three sentinels watching them."""

    def __init__(
        self, workdir: Path, *, min_replicas_to_write: int = 0, tls: Certificates | None = None
    ) -> None:
        self.servers = [RedisNode(workdir, "redis-a"), RedisNode(workdir, "redis-b")]
        # With `tls`, clients reach the sentinels over TLS (the servers stay on plain TCP).
        self.tls = tls
        # A primary without that many replicas in step refuses writes (NOREPLICAS).
        self.min_replicas_to_write = min_replicas_to_write
        self.sentinels = [RedisNode(workdir, f"sentinel-{i}") for i in range(3)]

    @property
    def sentinel_addresses(self) -> list[str]:
        return [f"127.0.0.1:{node.port}" for node in self.sentinels]

    def url(self, db: int = 0) -> str:
        """REDIS_URL under Sentinel: its host and port are not used, its database is."""
        return f"redis://127.0.0.1:{self.servers[0].port}/{db}"

    def _start_server(self, node: RedisNode, replica_of: tuple[str, int] | None) -> None:
        args = ["--port", str(node.port), "--bind", "127.0.0.1", "--dir", str(node.dir),
                "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
                "--protected-mode", "no",
                "--min-replicas-to-write", str(self.min_replicas_to_write)]  # fmt: skip
        if replica_of is not None:
            args += ["--replicaof", replica_of[0], str(replica_of[1])]
        node.start(*args)

    def start(self) -> None:
        primary, replica = self.servers
        self._start_server(primary, None)
        self._start_server(replica, primary.address)
        self.wait_replicated(primary)
        for sentinel in self.sentinels:
            config = sentinel.dir / "sentinel.conf"
            listen = f"port {sentinel.port}\n"
            if self.tls is not None:
                # Clients on the TLS port; the sentinels meet each other (and the servers)
                # on a plain one, as the servers serve plain TCP.
                listen = (
                    f"port {free_port()}\ntls-port {sentinel.port}\ntls-auth-clients no\n"
                    f"tls-cert-file {self.tls.server_cert}\ntls-key-file {self.tls.server_key}\n"
                    f"tls-ca-cert-file {self.tls.ca}\n"
                )
            config.write_text(
                f"{listen}bind 127.0.0.1\nprotected-mode no\n"
                f"dir {sentinel.dir}\n"
                f"sentinel monitor {MASTER} 127.0.0.1 {primary.port} 2\n"
                f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {MASTER} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {MASTER} 1\n"
            )
            sentinel.start(str(config), "--sentinel", client=self.sentinel_client(sentinel))
        self.wait_until_watched()

    def wait_replicated(self, primary: RedisNode, timeout: float = 30) -> None:
        """Until the primary has a replica whose link is up."""
        client = redis.Redis(port=primary.port)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = client.info("replication")
            if info.get("connected_slaves", 0) >= 1 and info["slave0"]["state"] == "online":
                return
            time.sleep(0.1)
        raise AssertionError(f"{primary.name} has no replica online")

    def wait_until_watched(self, timeout: float = 30) -> None:
        """Until every sentinel sees the two others and the primary's replica."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states: list[Any] = [
                self.sentinel_client(s).sentinel_master(MASTER) for s in self.sentinels
            ]
            if all(s["num-other-sentinels"] == 2 and s["num-slaves"] >= 1 for s in states):
                return
            time.sleep(0.2)
        raise AssertionError("the sentinels do not watch the primary and its replica")

    def tls_options(self) -> dict[str, Any]:
        """redis-py's `ssl_*` options that reach the sentinels (with `tls`)."""
        assert self.tls is not None
        return {"ssl_ca_certs": str(self.tls.ca), "ssl_cert_reqs": "required"}

    def sentinel_addresses_by_name(self) -> list[tuple[str, int]]:
        """The sentinels as `localhost`: the name their certificate holds."""
        return [("localhost", node.port) for node in self.sentinels]

    def sentinel_client(self, node: RedisNode) -> redis.Redis:
        if self.tls is None:
            return redis.Redis(port=node.port, decode_responses=True)
        return redis.Redis(
            host="localhost", port=node.port, decode_responses=True, ssl=True, **self.tls_options()
        )

    def sentinel(self) -> Sentinel:
        if self.tls is None:
            return Sentinel([node.address for node in self.sentinels], socket_timeout=1)
        return Sentinel(
            self.sentinel_addresses_by_name(),
            socket_timeout=1,
            sentinel_kwargs={"socket_timeout": 1, "ssl": True, **self.tls_options()},
        )

    def master(self) -> tuple[str, int]:
        """The primary as redis-py finds it."""
        found: tuple[str, int] = self.sentinel().discover_master(MASTER)
        return found

    def primary(self) -> RedisNode:
        _host, port = self.master()
        return next(node for node in self.servers if node.port == port)

    def wait_for_new_master(self, old: tuple[str, int], timeout: float = 60) -> tuple[str, int]:
        """The primary the sentinels name once it is no longer `old`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                found = self.master()
            except MasterNotFoundError:
                found = old
            if found != old:
                return found
            time.sleep(0.1)
        raise AssertionError(f"no failover from {old} within {timeout} s")

    def restart_as_replica(self, node: RedisNode) -> None:
        """A killed server starts again as the replica of the primary the sentinels name."""
        self._start_server(node, self.master())

    def stop(self) -> None:
        for node in [*self.sentinels, *self.servers]:
            node.stop()
