"""The fair scheduler's own cost: worker turns against the real Redis, beside a plain
LPUSH/RPOP queue measured in the same run as the baseline.

100 tenants x 3 classes are kept backlogged on one pool with one engine large enough never to
refuse a job. A worker's turn is what workers/dispatch.py does between two jobs: release the
job it ran and pick the next, one script call. The baseline does the same turn on a plain list
(LPUSH the finished job, RPOP the next, pipelined into one round trip). Each is run by one
client process (latency), then by --clients processes at once (throughput: many workers on
one Redis); then a separate pick and release (two round trips), a turn's first and last job.
Prints picks/s, p50/p99 per pick, the ratio to the baseline, and Redis's own CPU time per
pick (from INFO cpu), which says how many picks one Redis core can serve whatever else the
machine runs.

    .venv/bin/python bench/scheduler_picks.py --picks 5000 --clients 4
The goal: >= 5,000 picks/s and p99 under 2 ms on one core.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fairqueue.domain import EnginePolicy, FairQueueConfig, TenantPolicy
from fairqueue.queue import FairQueue
from protocol.classes import REQUEST_CLASSES

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


def fair_turns(queue: FairQueue, picks: int) -> list[float]:
    """Worker turns: release the job that ran and pick the next in one step."""
    latencies = []
    job = queue.pick(POOL)
    for _ in range(picks):
        if job is None:
            raise RuntimeError("the backlog ran dry before the round ended")
        start = time.perf_counter()
        job = queue.release_and_pick(job, 100, 50, pool=POOL)[1]
        latencies.append(time.perf_counter() - start)
    if job is not None:
        queue.release(POOL, job.job_id, 100, 50, attempt=job.attempt)
    return latencies


def fair_two_steps(queue: FairQueue, picks: int) -> list[float]:
    latencies = []
    for _ in range(picks):
        start = time.perf_counter()
        job = queue.pick(POOL)
        if job is None:
            raise RuntimeError("the backlog ran dry before the round ended")
        queue.release(POOL, job.job_id, 100, 50, attempt=job.attempt)
        latencies.append(time.perf_counter() - start)
    return latencies


def plain_turns(client: redis.Redis, picks: int) -> list[float]:
    latencies = []
    pipe = client.pipeline(transaction=False)
    for _ in range(picks):
        start = time.perf_counter()
        pipe.lpush("bench:done", "x")  # the plain queue's 'release', and its next pick
        pipe.rpop("bench:plain")
        if pipe.execute()[1] is None:
            raise RuntimeError("the plain backlog ran dry")
        latencies.append(time.perf_counter() - start)
    return latencies


def plain_two_steps(client: redis.Redis, picks: int) -> list[float]:
    latencies = []
    for _ in range(picks):
        start = time.perf_counter()
        client.rpop("bench:plain")
        client.lpush("bench:done", "x")
        latencies.append(time.perf_counter() - start)
    return latencies


ROUNDS: dict[str, Callable[[FairQueue, int], list[float]]] = {
    "fair": fair_turns,
    "fair2": fair_two_steps,
    "plain": lambda queue, picks: plain_turns(queue.redis, picks),
    "plain2": lambda queue, picks: plain_two_steps(queue.redis, picks),
}


def _client(url: str) -> FairQueue:
    return FairQueue(redis.Redis.from_url(url), FairQueueConfig(prefix="bench:fq:"))


def _one_client(url: str, kind: str, picks: int, go: Any, results: Any) -> None:
    queue = _client(url)
    ROUNDS[kind](queue, 20)  # connected, scripts loaded
    go.wait()
    results.put(ROUNDS[kind](queue, picks))


def run_round(url: str, kind: str, clients: int, picks: int) -> tuple[float, list[float], float]:
    """(picks/s over the round's wall time, latencies, Redis CPU seconds per pick)."""
    ctx = multiprocessing.get_context("fork")
    go, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_one_client, args=(url, kind, picks, go, results))
             for _ in range(clients)]  # fmt: skip
    for proc in procs:
        proc.start()
    time.sleep(0.5)  # all connected and warm
    monitor = redis.Redis.from_url(url)
    cpu_before = _redis_cpu(monitor)
    start = time.perf_counter()
    go.set()
    latencies = [x for _ in procs for x in results.get(timeout=600)]
    wall = time.perf_counter() - start
    cpu = _redis_cpu(monitor) - cpu_before
    for proc in procs:
        proc.join()
    return len(latencies) / wall, latencies, cpu / len(latencies)


def _redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def summary(name: str, measured: tuple[float, list[float], float]) -> float:
    rate, latencies, redis_cpu = measured
    ordered = sorted(latencies)
    p50 = statistics.median(ordered) * 1000
    p99 = ordered[int(0.99 * (len(ordered) - 1))] * 1000
    print(
        f"{name:<28} {rate:7.0f} picks/s   p50 {p50:6.3f} ms   p99 {p99:6.3f} ms   "
        f"Redis CPU {redis_cpu * 1e6:5.1f} us/pick (one core: {1 / redis_cpu:6.0f}/s)"
    )
    return rate


def compare(url: str, title: str, kinds: tuple[str, str], clients: int, picks: int) -> None:
    print(title)
    fair = summary("  fair queue", run_round(url, kinds[0], clients, picks))
    plain = summary("  plain list", run_round(url, kinds[1], clients, picks))
    print(f"  ratio fair/plain: {fair / plain:.2f}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--picks", type=int, default=5000, help="per client and round")
    parser.add_argument("--clients", type=int, default=4, help="client processes at once")
    parser.add_argument("--tenants", type=int, default=100)
    args = parser.parse_args()

    client = redis.Redis.from_url(args.redis_url)
    client.flushdb()
    picks_in_all = args.picks * (2 + args.clients) + 40 * (2 + args.clients)
    prepare(_client(args.redis_url), args.tenants,
            picks_in_all // (args.tenants * len(REQUEST_CLASSES)) + 2)  # fmt: skip
    client.lpush("bench:plain", *[f"job-{i}" for i in range(picks_in_all)])
    print(f"{args.tenants} tenants x {len(REQUEST_CLASSES)} classes backlogged\n")
    url, picks = args.redis_url, args.picks
    compare(url, "worker turn (release + next pick, one round trip), one client",
            ("fair", "plain"), 1, picks)  # fmt: skip
    compare(url, f"worker turn, {args.clients} clients at once",
            ("fair", "plain"), args.clients, picks)  # fmt: skip
    compare(url, "separate pick, then release (two round trips), one client",
            ("fair2", "plain2"), 1, picks)  # fmt: skip
    print("goal: >= 5,000 picks/s and p99 < 2 ms on one core")
    client.flushdb()


if __name__ == "__main__":
    main()
