"""The fair scheduler's own cost: pick + release against the real Redis, beside a plain
LPUSH/RPOP queue measured in the same run as the baseline.

100 tenants x 3 classes are kept backlogged on one pool with one engine large enough never to
refuse a job; one client process picks and releases as fast as it can (one core), then does
the same with LPUSH/RPOP on a plain list. Prints picks/s, p50/p99 per pick, and the ratio.

    .venv/bin/python bench/scheduler_picks.py --picks 5000
Goal (issue 4): >= 5,000 picks/s and p99 under 2 ms on one core.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.fairqueue.domain import EnginePolicy, FairQueueConfig, TenantPolicy
from scheduler.fairqueue.queue import FairQueue
from scheduler.request_classes import REQUEST_CLASSES

POOL, ENGINE = "bench", "bench-engine"
GIB = 1024**3


def prepare(queue: FairQueue, tenants: int, depth: int) -> None:
    queue.set_engine_policy(
        EnginePolicy(engine_id=ENGINE, pool=POOL, kv_budget_bytes=1000 * GIB, max_num_seqs=10**6)
    )
    for t in range(tenants):
        queue.set_tenant_policy(f"t{t}", TenantPolicy(weight=1 + t % 4, quota_bytes=100 * GIB))
    for _ in range(depth):
        for t in range(tenants):
            for request_class in REQUEST_CLASSES:
                queue.enqueue(tenant=f"t{t}", pool=POOL, request_class=request_class,
                              prompt_tokens=100, max_tokens=100, kv_bytes=1024 * 1024)  # fmt: skip


def fair_round(queue: FairQueue, picks: int) -> list[float]:
    latencies = []
    for _ in range(picks):
        start = time.perf_counter()
        job = queue.pick(POOL, ENGINE)
        if job is None:
            raise RuntimeError("the backlog ran dry: raise --depth")
        queue.release(job.job_id, 100, 50, attempt=job.attempt)
        latencies.append(time.perf_counter() - start)
    return latencies


def plain_round(client: redis.Redis, picks: int) -> list[float]:
    for i in range(picks):
        client.lpush("bench:plain", f"job-{i}")
    latencies = []
    for _ in range(picks):
        start = time.perf_counter()
        client.rpop("bench:plain")
        client.lpush("bench:done", "x")  # the 'release' of the plain queue
        latencies.append(time.perf_counter() - start)
    client.delete("bench:done")
    return latencies


def summary(name: str, latencies: list[float]) -> float:
    rate = len(latencies) / sum(latencies)
    ordered = sorted(latencies)
    p50 = statistics.median(ordered) * 1000
    p99 = ordered[int(0.99 * (len(ordered) - 1))] * 1000
    print(f"{name:<22} {rate:8.0f} picks/s   p50 {p50:6.3f} ms   p99 {p99:6.3f} ms")
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--picks", type=int, default=5000)
    parser.add_argument("--tenants", type=int, default=100)
    args = parser.parse_args()

    client = redis.Redis.from_url(args.redis_url)
    client.flushdb()
    queue = FairQueue(client, FairQueueConfig(prefix="bench:fq:"))
    depth = args.picks // (args.tenants * len(REQUEST_CLASSES)) + 2
    prepare(queue, args.tenants, depth)
    fair_round(queue, min(500, args.picks))  # warm: scripts loaded, connections open
    plain_round(client, 500)
    print(f"{args.tenants} tenants x {len(REQUEST_CLASSES)} classes backlogged, one client\n")
    fair = summary("fair queue pick+release", fair_round(queue, args.picks))
    plain = summary("plain RPOP+LPUSH", plain_round(client, args.picks))
    print(f"\nratio fair/plain: {fair / plain:.2f}   (goal: >= 5,000 picks/s, p99 < 2 ms)")
    client.flushdb()


if __name__ == "__main__":
    main()
