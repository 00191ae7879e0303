"""A Redis Cluster of three primaries, as real redis-server processes on free ports, for the
tests of cluster routing (tests/plumbing/test_cluster.py).

Each node runs in a folder of its own with `--cluster-enabled yes`; `redis-cli --cluster
create` joins them and spreads the 16384 slots over them, as an operator does. `move_slot`
moves one slot live, as `redis-cli --cluster reshard` does it, one step at a time, so a test
can look at a slot while it is half moved (ASK) and after (MOVED).
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from tests.support.harness import free_port
from tests.support.redis_sentinel import RedisNode

# A node also listens on its port + 10000 (the cluster bus), which must be a port too.
BUS_OFFSET = 10000


def _cluster_port(taken: set[int]) -> int:
    """A free port whose bus port is free too."""
    while True:
        port = free_port(avoid=taken)
        if port + BUS_OFFSET > 65535:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + BUS_OFFSET))
            except OSError:
                continue
        return port


class RedisCluster:
    def __init__(self, workdir: Path, primaries: int = 3) -> None:
        self.nodes = [RedisNode(workdir, f"cluster-{i}") for i in range(primaries)]
        taken: set[int] = set()
        for node in self.nodes:
            node.port = _cluster_port(taken)
            taken.update((node.port, node.port + BUS_OFFSET))

    def start(self) -> None:
        for node in self.nodes:
            node.start(
                "--port", str(node.port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
                "--save", "", "--appendonly", "no",
            )  # fmt: skip
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        subprocess.run(
            ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "0",
             "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = {self.client(node).cluster("INFO")["cluster_state"] for node in self.nodes}
            if states == {"ok"}:
                return
            time.sleep(0.1)
        raise AssertionError("the cluster did not reach cluster_state:ok")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}/0"

    @staticmethod
    def client(node: RedisNode) -> redis.Redis:
        return redis.Redis(port=node.port, decode_responses=True)

    def owner(self, slot: int) -> RedisNode:
        """The node that serves `slot` now."""
        for start, end, primary, *_ in self.client(self.nodes[0]).execute_command("CLUSTER SLOTS"):
            if start <= slot <= end:
                return next(node for node in self.nodes if node.port == int(primary[1]))
        raise AssertionError(f"no node serves slot {slot}")

    def begin_moving(self, slot: int, target: RedisNode) -> RedisNode:
        """Marks `slot` migrating from its owner to `target` (importing there); returns the
        owner. Keys not moved yet are served by the owner, the others answer ASK."""
        source = self.owner(slot)
        target_id = self.client(target).execute_command("CLUSTER MYID")
        source_id = self.client(source).execute_command("CLUSTER MYID")
        self.client(target).execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
        self.client(source).execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
        return source

    def move_keys(self, slot: int, source: RedisNode, target: RedisNode, keys: list[str]) -> None:
        self.client(source).execute_command(
            "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys
        )

    def finish_moving(self, slot: int, target: RedisNode) -> None:
        """Gives `slot` to `target` on every node (what `--cluster reshard` ends with)."""
        target_id = self.client(target).execute_command("CLUSTER MYID")
        for node in self.nodes:
            self.client(node).execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@contextmanager
def running_cluster(workdir: Path) -> Iterator[RedisCluster]:
    """A cluster started in `workdir`, stopped when the block ends however it ends."""
    cluster = RedisCluster(workdir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
