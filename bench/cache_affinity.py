"""Prefix-cache affinity against most-room routing: two engines in one pool, 8 tenants, each
with its own long system prompt and short questions.

Starts the platform as `make run` does (`bash scripts/run.sh`, see bench/serve_bench.py) once
per mode, with a second demo engine in the demo's pool, and each engine's KV cache capped
(GPUSHARE_ENGINE_KV_BLOCKS, default 64 blocks of 128 tokens: about half the tenants' prompts
fit in one engine, so an engine that serves every tenant evicts them). The platform runs on
ports of its own (8040, engines 8140 and 8141), its own var directory and database, so it
never meets a `make run` platform of this machine. Modes: `affinity` (GPUSHARE_CACHE_AFFINITY
on: a job runs on the engine that ran its tenant's latest job where that one can run it at
once) and `most-room` (off: the engine with the most free KV, the routing before affinity).

Load: each tenant a closed loop (--outstanding requests open) of streamed chat requests,
its system prompt (about --prompt-tokens tokens, its own words) and a short question,
--max-tokens tokens (ignore_eos), with a random think time (exponential, mean --think-s)
between its requests, so that requests arrive at engines in every state; --warmup-s, then
a --duration-s window. Per mode it prints: the prefix-cache hit rate (the engines' own
vllm:prefix_cache_hits / vllm:prefix_cache_queries over the window, both engines together,
and each engine's), TTFT p50 and p99, throughput (requests and output tokens per second
finished in the window), Jain's index over the tenants' output tokens in the window, and the
requests each engine ran (its vllm:request_success count).

    .venv/bin/python bench/cache_affinity.py                    # both modes, one run each
    .venv/bin/python bench/cache_affinity.py --modes affinity --duration-s 30

On 2 shared cores the engines, the platform and the client share the CPU: figures are
pessimistic and noisy; compare the two modes of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import redis
from common import REPO, http_client, jain_index, percentile, stream_request
from psycopg import sql
from serve_bench import manage, print_header, stop_platform, vllm_python, wait_for_free_ports

PORT, ENGINE_PORTS = 8040, (8140, 8141)
ENGINES = ("demo", "demo-b")
MODEL = "demo"
TENANTS = [f"bench-aff-{i}" for i in range(1, 9)]
WORDS = [
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
    "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango",
    "uniform", "victor", "whiskey", "xray", "yankee", "zulu",
]  # fmt: skip
TOKENS_PER_WORD = 4.4  # the demo model's tokenizer, on these words
QUESTIONS = [
    "What is the first word?", "Summarise the text.", "Count the words.", "Say hello.",
    "Which word repeats most?", "Answer briefly.", "Name a colour.", "Give one example.",
]  # fmt: skip


def platform_env(args: argparse.Namespace, affinity: bool) -> dict[str, str]:
    var = Path(args.var_dir)
    (var / "log").mkdir(parents=True, exist_ok=True)
    return {
        "GPUSHARE_VAR_DIR": str(var),
        "DATABASE_URL": args.database_url,
        "REDIS_URL": args.redis_url,
        "GPUSHARE_PORT": str(PORT),
        "GPUSHARE_DEMO_ENGINE_PORT": str(ENGINE_PORTS[0]),
        "GPUSHARE_DEMO_MODEL_DIR": str((REPO / "var" / "models" / "tiny-llama").resolve()),
        "GPUSHARE_VLLM_PYTHON": vllm_python(),
        "GPUSHARE_ENGINE_KV_BLOCKS": str(args.kv_blocks),
        "GPUSHARE_CACHE_AFFINITY": "true" if affinity else "false",
    }


def fresh_database(url: str) -> None:
    """The bench's database, dropped and made again: engines an earlier run left marked as
    running would be started by the engine agent as it comes up, beside run.sh's own start."""
    import psycopg  # the database is PostgreSQL here: the URL names one to drop

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


@contextmanager
def started_platform(args: argparse.Namespace, affinity: bool) -> Iterator[str]:
    """run.sh with this bench's environment, and the second engine; yields the demo key."""
    base = f"http://127.0.0.1:{PORT}"
    wait_for_free_ports([base, *(f"http://127.0.0.1:{p}" for p in ENGINE_PORTS)], 300)
    os.environ.update(platform_env(args, affinity))  # for run.sh and every manage.py call
    redis.Redis.from_url(args.redis_url).flushdb()
    fresh_database(args.database_url)
    credentials = Path(args.var_dir) / "demo-credentials.json"
    log_path = Path(args.var_dir) / "log" / f"run-{'affinity' if affinity else 'most-room'}.log"
    print(f"starting the platform: bash scripts/run.sh (log: {log_path})", flush=True)
    started = time.time()
    with log_path.open("wb") as log:
        run = subprocess.Popen(
            ["bash", "scripts/run.sh"], cwd=REPO, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        key = ""
        deadline = time.monotonic() + 600
        while not key:
            if run.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"run.sh did not serve:\n{log_path.read_text()[-3000:]}")
            with suppress(OSError, ValueError, KeyError, httpx.HTTPError):
                fresh = credentials.stat().st_mtime >= started - 1
                if fresh and httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
                    key = json.loads(credentials.read_text())["demo_api_key"]
            time.sleep(2)
        print(f"the platform serves (after {time.time() - started:.0f} s)", flush=True)
        manage(
            "engine", "create", ENGINES[1], "--served-model-name", MODEL, "--port",
            str(ENGINE_PORTS[1]), "--max-model-len", "2048", "--max-num-seqs", "16",
            "--if-missing",
        )  # fmt: skip
        manage("engine", "start", ENGINES[1])
        print(f"second engine ready (after {time.time() - started:.0f} s)", flush=True)
        yield key
    finally:
        with suppress(Exception):
            manage("engine", "stop", ENGINES[1], check=False)
        stop_platform(run)


def tenant_key(slug: str) -> str:
    policy = ["--quota-units", "16", "--classes", "interactive", "standard"]
    if manage("tenant", "show", slug, "--json", check=False).returncode == 0:
        manage("tenant", "update", slug, *policy, "--activate")
        options = ["--name", "cache-affinity", "--class", "interactive", "--json"]
        return str(json.loads(manage("key", "create", slug, *options).stdout)["key"])
    created = json.loads(manage("tenant", "create", slug, *policy, "--json").stdout)
    return str(created["api_key"]["key"])


def system_prompt(slug: str, tokens: int) -> str:
    rng = random.Random(slug)
    words = [rng.choice(WORDS) for _ in range(int(tokens / TOKENS_PER_WORD))]
    return f"You are the assistant of {slug}. " + " ".join(words)


def engine_metrics() -> dict[str, dict[str, float]]:
    """Each engine's prefix-cache hits and queries (tokens) and finished requests."""
    found: dict[str, dict[str, float]] = {}
    for name, port in zip(ENGINES, ENGINE_PORTS, strict=True):
        key = manage("engine", "key", name).stdout.strip()
        text = httpx.get(
            f"http://127.0.0.1:{port}/metrics",
            headers={"Authorization": f"Bearer {key}"},
            timeout=10,
        ).text
        values = {"hits": 0.0, "queries": 0.0, "requests": 0.0}
        for line in text.splitlines():
            for field, metric in (
                ("hits", "vllm:prefix_cache_hits_total"),
                ("queries", "vllm:prefix_cache_queries_total"),
                ("requests", "vllm:request_success_total"),
            ):
                if line.startswith(metric):
                    values[field] += float(line.rsplit(" ", 1)[1])
        found[name] = values
    return found


async def tenant_loop(
    client: httpx.AsyncClient, key: str, slug: str, args: argparse.Namespace,
    stop_at: float, records: list[dict[str, Any]],
) -> None:  # fmt: skip
    rng = random.Random(f"{slug}-think")
    prompt = system_prompt(slug, args.prompt_tokens)
    url = f"http://127.0.0.1:{PORT}/v1/chat/completions"
    n = 0
    while time.perf_counter() < stop_at:
        n += 1
        body = {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": prompt},
                {"role": "user", "content": f"{QUESTIONS[n % len(QUESTIONS)]} ({n})"},
            ],
            "max_tokens": args.max_tokens, "ignore_eos": True, "temperature": 0,
        }  # fmt: skip
        outcome = await stream_request(client, url, body, {"Authorization": f"Bearer {key}"})
        records.append({
            "tenant": slug, "ok": outcome.ok, "ttft": outcome.ttft, "error": outcome.error,
            "finished": outcome.finished_at, "prompt_tokens": outcome.prompt_tokens,
            "completion_tokens": outcome.completion_tokens,
        })  # fmt: skip
        await asyncio.sleep(rng.expovariate(1 / args.think_s) if args.think_s > 0 else 0)


async def load(keys: dict[str, str], args: argparse.Namespace) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    stop_at = time.perf_counter() + args.warmup_s + args.duration_s
    async with http_client(len(keys) * args.outstanding) as client:
        loops = [
            tenant_loop(client, key, slug, args, stop_at, records)
            for slug, key in keys.items()
            for _ in range(args.outstanding)
        ]
        await asyncio.gather(*loops)
    return records


async def measured(keys: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """The load, with the engines' counters read as the window opens and as it closes."""
    task = asyncio.ensure_future(load(keys, args))
    await asyncio.sleep(args.warmup_s)
    opened, before = time.perf_counter(), await asyncio.to_thread(engine_metrics)
    await asyncio.sleep(args.duration_s)
    closed, after = time.perf_counter(), await asyncio.to_thread(engine_metrics)
    records = await task
    inside = [r for r in records if r["ok"] and opened <= r["finished"] <= closed]
    return {"window": closed - opened, "before": before, "after": after, "records": records,
            "inside": inside}  # fmt: skip


def summary(mode: str, result: dict[str, Any]) -> dict[str, Any]:
    inside, window = result["inside"], result["window"]
    fields = ("hits", "queries", "requests")
    delta = {
        name: {f: result["after"][name][f] - result["before"][name][f] for f in fields}
        for name in ENGINES
    }
    hits = sum(d["hits"] for d in delta.values())
    queries = sum(d["queries"] for d in delta.values())
    ttfts = [r["ttft"] for r in inside]
    tokens = dict.fromkeys(TENANTS, 0.0)
    for r in inside:
        tokens[r["tenant"]] += r["completion_tokens"]
    errors = [r for r in result["records"] if not r["ok"]]
    return {
        "mode": mode,
        "hit_rate": hits / queries if queries else float("nan"),
        "engine_hit_rates": {
            n: (d["hits"] / d["queries"] if d["queries"] else float("nan"))
            for n, d in delta.items()
        },
        "engine_requests": {n: int(d["requests"]) for n, d in delta.items()},
        "ttft_p50_ms": percentile(ttfts, 0.5) * 1000 if ttfts else float("nan"),
        "ttft_p99_ms": percentile(ttfts, 0.99) * 1000 if ttfts else float("nan"),
        "requests_s": len(inside) / window,
        "tokens_s": sum(tokens.values()) / window,
        "jain": jain_index(list(tokens.values())),
        "requests": len(inside),
        "errors": len(errors),
        "first_error": errors[0]["error"][:200] if errors else "",
        "prompt_tokens": max((r["prompt_tokens"] for r in inside), default=0),
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    print()
    head = (
        f"{'mode':<10} {'hit rate':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'req/s':>6} "
        f"{'tok/s':>7} {'Jain':>6} {'requests':>8} {'errors':>6}  per engine (hit rate, requests)"
    )
    print(head)
    print("-" * len(head))
    for row in rows:
        engines = ", ".join(
            f"{n} {row['engine_hit_rates'][n]:.2f} {row['engine_requests'][n]}" for n in ENGINES
        )
        print(
            f"{row['mode']:<10} {row['hit_rate']:>8.3f} {row['ttft_p50_ms']:>7.0f}ms "
            f"{row['ttft_p99_ms']:>7.0f}ms {row['requests_s']:>6.2f} {row['tokens_s']:>7.1f} "
            f"{row['jain']:>6.3f} {row['requests']:>8} {row['errors']:>6}  {engines}"
        )
    if len(rows) == 2 and rows[1]["ttft_p50_ms"] > 0:
        a, b = rows
        p50 = a["ttft_p50_ms"] / b["ttft_p50_ms"] - 1
        print(
            f"\n{a['mode']} against {b['mode']}: TTFT p50 {p50:+.0%}, "
            f"p99 {a['ttft_p99_ms'] / b['ttft_p99_ms'] - 1:+.0%}, "
            f"throughput (tokens/s) {a['tokens_s'] / b['tokens_s'] - 1:+.0%}"
        )
    for row in rows:
        if row["first_error"]:
            print(f"{row['mode']}: first error: {row['first_error']}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="affinity,most-room")
    parser.add_argument("--kv-blocks", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=1500)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--outstanding", type=int, default=1)
    parser.add_argument("--think-s", type=float, default=0.5)
    parser.add_argument("--warmup-s", type=float, default=20)
    parser.add_argument("--duration-s", type=float, default=60)
    parser.add_argument("--var-dir", default="/tmp/gpushare-cache-affinity/var")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/cache_affinity"),
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    print_header()
    print(
        f"load:    {len(TENANTS)} tenants, {args.outstanding} open each, system prompt "
        f"~{args.prompt_tokens} tokens, {args.max_tokens} output tokens, think "
        f"{args.think_s:g} s, {args.duration_s:g} s window after {args.warmup_s:g} s; "
        f"engines {', '.join(ENGINES)} with {args.kv_blocks} KV blocks each",
        flush=True,
    )
    rows = []
    for mode in args.modes.split(","):
        with started_platform(args, affinity=mode == "affinity"):
            keys = {slug: tenant_key(slug) for slug in TENANTS}
            result = asyncio.run(measured(keys, args))
        row = summary(mode, result)
        print(json.dumps(row), flush=True)
        rows.append(row)
    print_table(rows)


if __name__ == "__main__":
    main()
