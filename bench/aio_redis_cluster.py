"""Calls on a Redis Cluster from an event loop: CPU per call of
`plumbing.aio_redis_cluster.AsyncRedisCluster` against redis-py's asyncio cluster client
(`redis.asyncio.cluster.RedisCluster`), in the same run, on a cluster of three primaries
this script starts (or the one `--cluster-url` names).

Two kinds of call, each way in alternating rounds, on uvloop:
- `get`: one GET of a key spread over every slot (a call routed by its key);
- `turn`: a pipeline of four commands on one pool's hash tag (HSET, RPUSH, HGET, LPOP),
  the shape of a fair-queue call.
Prints the client's CPU time per call (time.process_time: this process only) and the
ratio. Redis's own CPU is the same either way (the same commands).

    .venv/bin/python bench/aio_redis_cluster.py --calls 3000 --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis.asyncio.cluster as aiocluster
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plumbing.aio_redis_cluster import AsyncRedisCluster
from tests.support.redis_cluster import RedisCluster

KEYS = [f"bench:{i}" for i in range(1000)]
TAG = "{p:bench}"
TURN: list[tuple[Any, ...]] = [
    ("HSET", f"{TAG}:job", "state", "running"),
    ("RPUSH", f"{TAG}:q", "job"),
    ("HGET", f"{TAG}:job", "state"),
    ("LPOP", f"{TAG}:q"),
]


async def redis_py(url: str, calls: int, kind: str) -> float:
    client = aiocluster.RedisCluster.from_url(url, socket_timeout=60)
    await client.initialize()
    for key in KEYS:
        await client.set(key, "x")

    async def get(i: int) -> object:
        return await client.get(KEYS[i % len(KEYS)])

    async def turn(i: int) -> object:
        pipe = client.pipeline(transaction=False)
        for command in TURN:
            pipe.execute_command(*command)
        return await pipe.execute()

    per_call = await _timed(get if kind == "get" else turn, calls)
    await client.aclose()
    return per_call


async def ours(url: str, calls: int, kind: str) -> float:
    client = AsyncRedisCluster(url, max_connections=4, read_timeout_s=60)
    for key in KEYS:
        await client.call("SET", key, "x")

    async def get(i: int) -> object:
        return await client.call("GET", KEYS[i % len(KEYS)])

    async def turn(i: int) -> object:
        return await client.pipeline(TURN)

    per_call = await _timed(get if kind == "get" else turn, calls)
    client.close()
    return per_call


async def _timed(call: Callable[[int], Awaitable[object]], calls: int) -> float:
    started = time.process_time()
    for i in range(calls):
        if await call(i) is None:
            raise RuntimeError("no reply: the benchmark is broken")
    return (time.process_time() - started) / calls


def measure(url: str, calls: int, rounds: int) -> None:
    for kind in ("get", "turn"):
        old: list[float] = []
        new: list[float] = []
        for round_ in range(1, rounds + 1):
            for name, run, results in (("redis-py", redis_py, old), ("ours", ours, new)):
                results.append(uvloop.run(run(url, calls, kind)))
                print(
                    f"{kind:>4} round {round_} {name:>9}: {results[-1] * 1e6:6.1f} us CPU per call"
                )
        best_old, best_new = min(old), min(new)
        print(f"{kind:>4}: redis-py RedisCluster {best_old * 1e6:.1f} us, AsyncRedisCluster "
              f"{best_new * 1e6:.1f} us (best round each); ratio ours/redis-py "
              f"{best_new / best_old:.2f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cluster-url", help="a node of a running cluster (default: start one)")
    args = parser.parse_args()
    if args.cluster_url:
        measure(args.cluster_url, args.calls, args.rounds)
        return
    with tempfile.TemporaryDirectory() as workdir:
        cluster = RedisCluster(Path(workdir))
        try:
            cluster.start()
            measure(cluster.url, args.calls, args.rounds)
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
