"""The fair queue's calls to Redis: caller CPU per call over `RawRedis` (its lean connections,
plumbing/raw_redis.py) against redis-py (what it used before), in the same run.

Two calls the online path makes for every request, each way in alternating rounds:
- a worker's turn: `release_and_pick` on a pool kept backlogged (one script call);
- a relayed event: `publish` of an event-sized chunk (MULTI, RPUSH, EXPIRE, EXEC).
Prints the client's CPU time per call (time.process_time: only this process's CPU) and the
ratio new/old. Redis runs the same commands either way.

    .venv/bin/python bench/raw_redis.py --calls 3000 --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fairqueue.domain import EnginePolicy, FairQueueConfig, TenantPolicy
from fairqueue.queue import FairQueue

POOL, ENGINE, GIB = "bench", "bench-engine", 1024**3
CHUNK = {"event": "chunk", "attempt": 1, "data": {"choices": [{"delta": {"content": "word"}}]}}


def fair_queue(client: redis.Redis, lean: bool) -> FairQueue:
    queue = FairQueue(client, FairQueueConfig(prefix="gs:bench-raw:"))
    if not lean:
        queue._raw = None  # redis-py for everything, as before
    return queue


def turns(queue: FairQueue, calls: int) -> Callable[[], None]:
    queue.set_engine_policy(
        EnginePolicy(engine_id=ENGINE, pool=POOL, kv_budget_bytes=1000 * GIB, max_num_seqs=10**6)
    )
    queue.set_tenant_policy("t", TenantPolicy(weight=1, quota_bytes=100 * GIB))
    for _ in range(calls + 2):  # one for the untimed first call
        queue.enqueue(tenant="t", pool=POOL, request_class="standard", prompt_tokens=100,
                      max_tokens=100, kv_bytes=1024 * 1024)  # fmt: skip
    job = queue.pick(POOL)

    def turn() -> None:
        nonlocal job
        if job is None:
            raise RuntimeError("the backlog ran dry: the benchmark is broken")
        job = queue.release_and_pick(job, 100, 100, pool=POOL)[1]

    return turn


def publishes(queue: FairQueue, calls: int) -> Callable[[], None]:
    return lambda: queue.publish(POOL, "bench-job", CHUNK)


def timed(call: Callable[[], None], calls: int) -> float:
    started = time.process_time()
    for _ in range(calls):
        call()
    return (time.process_time() - started) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    args = parser.parse_args()
    client = redis.Redis.from_url(args.redis_url, decode_responses=True)
    best: dict[tuple[str, str], float] = {}
    for round_ in range(1, args.rounds + 1):
        for what, make in (("turn", turns), ("publish", publishes)):
            for name, lean in (("redis-py", False), ("RawRedis", True)):
                client.flushdb()
                queue = fair_queue(client, lean)
                call = make(queue, args.calls)
                call()  # connects: not counted
                per_call = timed(call, args.calls)
                key = (what, name)
                best[key] = min(best.get(key, per_call), per_call)
                print(f"round {round_}  {what:>7} {name:>8}: {per_call * 1e6:6.1f} us CPU per call")
    client.flushdb()
    for what in ("turn", "publish"):
        old, new = best[(what, "redis-py")], best[(what, "RawRedis")]
        print(f"{what}: redis-py {old * 1e6:.1f} us, RawRedis {new * 1e6:.1f} us "
              f"(best round each); ratio new/old: {new / old:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
