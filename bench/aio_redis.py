"""The web's wait for a job's event: CPU per BLPOP of `plumbing.aio_redis.AsyncRedis`
against redis-py's asyncio client (what the web used before), in the same run.

Fills a list with event-sized elements, then pops them one call at a time on the web's event
loop (uvloop), each way in alternating rounds, and prints the client's CPU time per call
(time.process_time: only this process's CPU) and the ratio new/old. Redis's own CPU is the
same either way (the same command).

    .venv/bin/python bench/aio_redis.py --calls 3000 --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import redis
import redis.asyncio as aioredis
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plumbing.aio_redis import AsyncRedis

KEY = "bench:events"
EVENT = '{"event":"done","attempt":1,"usage":{"prompt_tokens":12,"completion_tokens":64}}'


async def redis_py(url: str, calls: int) -> float:
    client = aioredis.Redis.from_url(url, decode_responses=True, socket_timeout=60)
    await client.ping()
    per_call = await _timed(lambda: client.blpop([KEY], timeout=1), calls)
    await client.aclose()
    return per_call


async def blocking_pops(url: str, calls: int) -> float:
    pops = AsyncRedis(url, max_connections=1, read_timeout_s=60)
    await pops.blpop(KEY, 1)  # connects: not counted, as redis-py's ping above
    per_call = await _timed(lambda: pops.blpop(KEY, 1), calls)
    pops.close()
    return per_call


async def _timed(call: Callable[[], Awaitable[object]], calls: int) -> float:
    started = time.process_time()
    for _ in range(calls):
        if await call() is None:
            raise RuntimeError("the list ran dry: the benchmark is broken")
    return (time.process_time() - started) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    args = parser.parse_args()
    sync = redis.Redis.from_url(args.redis_url)
    old: list[float] = []
    new: list[float] = []
    for round_ in range(1, args.rounds + 1):
        for name, run, results in (
            ("redis-py", redis_py, old),
            ("AsyncRedis", blocking_pops, new),
        ):
            sync.delete(KEY)
            sync.rpush(KEY, *([EVENT] * (args.calls + 1)))
            results.append(uvloop.run(run(args.redis_url, args.calls)))
            print(f"round {round_}  {name:>12}: {results[-1] * 1e6:6.1f} us CPU per BLPOP")
    sync.delete(KEY)
    best_old, best_new = min(old), min(new)
    print(f"redis-py asyncio: {best_old * 1e6:.1f} us, AsyncRedis: {best_new * 1e6:.1f} us "
          f"(best round each); ratio new/old: {best_new / best_old:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
