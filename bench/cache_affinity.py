"""Prefix-cache affinity against most-room routing: two engines in one pool, 8 tenants, each
with its own long system prompt and short questions.

Starts the platform once as `make run` does (`bash scripts/run.sh`, see bench/serve_bench.py),
with a second engine in the demo's pool and each engine's KV cache capped
(GPUSHARE_ENGINE_KV_BLOCKS, default 64 blocks of 128 tokens: about half the tenants' prompts
fit in one engine, so an engine that serves every tenant evicts them). The platform runs on
ports of its own (8040, engines 8140 and 8141), its own var directory and database, so it
never meets a `make run` platform of this machine. The modes differ only in the web that
takes the requests: GPUSHARE_CACHE_AFFINITY is read where a job is enqueued (its affinity
key, scheduler/engines/calls.py), so run.sh's web (8040) runs with it on, `affinity`: a job
runs on the engine that ran its tenant's latest job where that one can run it at once; and a
second web of the same platform (8041) with it off, `most-room`: the engine with the most free
KV, the routing before affinity. Both share the workers, the queue and the engines, so the
modes alternate in one run (--rounds rounds, each mode once per round, the order reversed
every other round: A B B A), and the machine's other load falls on both alike.

The engines serve a model generated for the bench (scripts/make_tiny_model.py --layers
--hidden --intermediate, default 2 layers 256 wide, into the var directory): the demo model
(2 layers, 128 wide; --model-shape demo) prefills a whole prompt in a few milliseconds on the
CPU, so that a prefix-cache hit saves nothing measurable, while on a model much larger than
the default, two engines on 2 cores take seconds over each prompt they miss, and every
request of that engine waits for it.

Load (--loads, each OUTSTANDING:THINK_S): each tenant keeps OUTSTANDING streamed chat
requests open (closed loops), its system prompt (about --prompt-tokens tokens, its own words)
and a short question, --max-tokens tokens (ignore_eos), with a random think time
(exponential, mean THINK_S; 0: none) between its requests. Every tenant has the weight 1.
The default loads are 1:0.5, tenants that pause, so that both engines often have room when a
request comes and the routing has a choice to make; and 2:0, every tenant backlogged (16
requests open, more than the engines' KV holds at once), so that the fair queue decides each
tenant's share, while affinity can move a job only to an engine with room for it now. For
each load, round and mode: --warmup-s, then a --duration-s window. Per load and mode, over its
windows together, it prints: the prefix-cache hit rate (the engines' own
vllm:prefix_cache_hits / vllm:prefix_cache_queries, both engines together, and each
engine's), TTFT p50 and p99, throughput (requests and output tokens per second finished in
the windows), Jain's index over the tenants' output tokens in the windows, and the requests
each engine ran (its vllm:request_success count); below, the TTFT p50 of the requests whose
usage says the cache held half their prompt or more, and of the others.

    .venv/bin/python bench/cache_affinity.py                    # both modes, 2 rounds
    .venv/bin/python bench/cache_affinity.py --modes affinity --rounds 1 --duration-s 30

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
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import redis
from common import REPO, hears_ctrl_c, http_client, jain_index, percentile, stream_request
from psycopg import sql
from serve_bench import (
    VENV_PYTHON,
    manage,
    print_header,
    stop_platform,
    vllm_python,
    wait_for_free_ports,
)

PORT, ENGINE_PORTS = 8040, (8140, 8141)
MOST_ROOM_PORT = 8041  # the second web, GPUSHARE_CACHE_AFFINITY off
MODE_PORTS = {"affinity": PORT, "most-room": MOST_ROOM_PORT}
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


def model_dir(args: argparse.Namespace) -> Path:
    """The engines' model: the demo model, or one of --model-shape made for the bench (a
    folder per shape: make_tiny_model.py leaves a complete folder as it is)."""
    if args.model_shape == "demo":
        return (REPO / "var" / "models" / "tiny-llama").resolve()
    layers, hidden, intermediate = (int(v) for v in args.model_shape.split(","))
    target = Path(args.var_dir).resolve() / "models" / f"llama-{layers}x{hidden}x{intermediate}"
    subprocess.run(
        [vllm_python(), "scripts/make_tiny_model.py", str(target), "--layers", str(layers),
         "--hidden", str(hidden), "--intermediate", str(intermediate)],
        cwd=REPO, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return target


def platform_env(args: argparse.Namespace, model: Path) -> dict[str, str]:
    var = Path(args.var_dir)
    (var / "log").mkdir(parents=True, exist_ok=True)
    return {
        "GPUSHARE_VAR_DIR": str(var),
        "DATABASE_URL": args.database_url,
        "REDIS_URL": args.redis_url,
        "GPUSHARE_PORT": str(PORT),
        "GPUSHARE_DEMO_ENGINE_PORT": str(ENGINE_PORTS[0]),
        "GPUSHARE_DEMO_MODEL_DIR": str(model),
        "GPUSHARE_VLLM_PYTHON": vllm_python(),
        "GPUSHARE_ENGINE_KV_BLOCKS": str(args.kv_blocks),
        "GPUSHARE_CACHE_AFFINITY": "true",
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
def started_platform(args: argparse.Namespace, model: Path) -> Iterator[str]:
    """run.sh with this bench's environment, the second engine and the second web; yields
    the demo key."""
    base = f"http://127.0.0.1:{PORT}"
    ports = [PORT, MOST_ROOM_PORT, *ENGINE_PORTS]
    wait_for_free_ports([f"http://127.0.0.1:{p}" for p in ports], 300)
    os.environ.update(platform_env(args, model))  # for run.sh and every manage.py call
    redis.Redis.from_url(args.redis_url).flushdb()
    fresh_database(args.database_url)
    credentials = Path(args.var_dir) / "demo-credentials.json"
    log_path = Path(args.var_dir) / "log" / "run.log"
    print(f"starting the platform: bash scripts/run.sh (log: {log_path})", flush=True)
    started = time.time()
    with log_path.open("wb") as log:
        run = subprocess.Popen(
            ["bash", "scripts/run.sh"], cwd=REPO, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=hears_ctrl_c,
        )  # fmt: skip
    web: subprocess.Popen[bytes] | None = None
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
        web = second_web(Path(args.var_dir) / "log" / "web-most-room.log")
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
        if web is not None:
            web.terminate()
            with suppress(subprocess.TimeoutExpired):
                web.wait(timeout=20)
            if web.poll() is None:
                web.kill()
        stop_platform(run)


def second_web(log_path: Path) -> subprocess.Popen[bytes]:
    """The web as run.sh starts it (its access log on too, so that both webs spend alike), on
    MOST_ROOM_PORT with GPUSHARE_CACHE_AFFINITY off."""
    env = {**os.environ, "GPUSHARE_CACHE_AFFINITY": "false"}
    with log_path.open("wb") as log:
        web = subprocess.Popen(
            [str(VENV_PYTHON), "-m", "plumbing.serve", "config.asgi:application", "--host",
             "127.0.0.1", "--port", str(MOST_ROOM_PORT), "--log-level", "info"],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        if web.poll() is not None or time.monotonic() > deadline:
            web.kill()
            raise SystemExit(f"the second web did not serve:\n{log_path.read_text()[-3000:]}")
        with suppress(httpx.HTTPError):
            url = f"http://127.0.0.1:{MOST_ROOM_PORT}/readyz"
            if httpx.get(url, timeout=5).status_code == 200:
                return web
        time.sleep(1)


def tenant_key(slug: str) -> str:
    policy = ["--weight", "1", "--quota-units", "16", "--classes", "interactive", "standard"]
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


@cache
def engine_key(name: str) -> str:
    """What the engine's /metrics accepts; read once (a manage.py call costs the load's CPU)."""
    return manage("engine", "key", name).stdout.strip()


def engine_metrics() -> dict[str, dict[str, float]]:
    """Each engine's prefix-cache hits and queries (tokens) and finished requests."""
    found: dict[str, dict[str, float]] = {}
    for name, port in zip(ENGINES, ENGINE_PORTS, strict=True):
        key = engine_key(name)
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


@dataclass(frozen=True)
class Load:
    outstanding: int  # requests each tenant keeps open
    think_s: float  # mean think time between a tenant's requests; 0: none

    @property
    def label(self) -> str:
        return f"{self.outstanding}:{self.think_s:g}"

    def describe(self) -> str:
        think = f"think {self.think_s:g} s" if self.think_s > 0 else "no think time"
        return f"{self.outstanding} open per tenant, {think}"


async def tenant_loop(
    client: httpx.AsyncClient, url: str, key: str, slug: str, args: argparse.Namespace,
    think_s: float, stop_at: float, records: list[dict[str, Any]],
) -> None:  # fmt: skip
    rng = random.Random(f"{slug}-think")
    prompt = system_prompt(slug, args.prompt_tokens)
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
            "completion_tokens": outcome.completion_tokens, "cached": outcome.cached_tokens,
        })  # fmt: skip
        await asyncio.sleep(rng.expovariate(1 / think_s) if think_s > 0 else 0)


async def run_load(
    keys: dict[str, str], args: argparse.Namespace, url: str, load: Load
) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    stop_at = time.perf_counter() + args.warmup_s + args.duration_s
    async with http_client(len(keys) * load.outstanding) as client:
        loops = [
            tenant_loop(client, url, key, slug, args, load.think_s, stop_at, records)
            for slug, key in keys.items()
            for _ in range(load.outstanding)
        ]
        await asyncio.gather(*loops)
    return records


async def measured(
    keys: dict[str, str], args: argparse.Namespace, mode: str, load: Load
) -> dict[str, Any]:
    """One window of a mode: the load through the mode's web, with the engines' counters read
    as the window opens and as it closes. The load stops at the window's end, and its open
    requests finish before the next window's warm-up begins."""
    url = f"http://127.0.0.1:{MODE_PORTS[mode]}/v1/chat/completions"
    task = asyncio.ensure_future(run_load(keys, args, url, load))
    await asyncio.sleep(args.warmup_s)
    opened, before = time.perf_counter(), await asyncio.to_thread(engine_metrics)
    await asyncio.sleep(args.duration_s)
    closed, after = time.perf_counter(), await asyncio.to_thread(engine_metrics)
    records = await task
    fields = ("hits", "queries", "requests")
    return {
        "window": closed - opened,
        "delta": {n: {f: after[n][f] - before[n][f] for f in fields} for n in ENGINES},
        "records": records,
        "inside": [r for r in records if r["ok"] and opened <= r["finished"] <= closed],
    }


def summary(mode: str, load: Load, results: list[dict[str, Any]]) -> dict[str, Any]:
    """A mode's windows of one load, together."""
    window = sum(r["window"] for r in results)
    inside = [rec for r in results for rec in r["inside"]]
    every = [rec for r in results for rec in r["records"]]
    delta = {
        n: {f: sum(r["delta"][n][f] for r in results) for f in ("hits", "queries", "requests")}
        for n in ENGINES
    }
    hits = sum(d["hits"] for d in delta.values())
    queries = sum(d["queries"] for d in delta.values())
    ttfts = [r["ttft"] for r in inside]
    # A hit: the engine's cache held at least half the prompt (its tenant's system prompt).
    hit = [r["ttft"] for r in inside if r["cached"] * 2 >= r["prompt_tokens"] > 0]
    miss = [r["ttft"] for r in inside if not r["cached"] * 2 >= r["prompt_tokens"] > 0]
    tokens = dict.fromkeys(TENANTS, 0.0)
    for r in inside:
        tokens[r["tenant"]] += r["completion_tokens"]
    errors = [r for r in every if not r["ok"]]
    return {
        "mode": mode,
        "load": load.label,
        "windows": len(results),
        "hit_rate": hits / queries if queries else float("nan"),
        "engine_hit_rates": {
            n: (d["hits"] / d["queries"] if d["queries"] else float("nan"))
            for n, d in delta.items()
        },
        "engine_requests": {n: int(d["requests"]) for n, d in delta.items()},
        "ttft_p50_ms": percentile(ttfts, 0.5) * 1000 if ttfts else float("nan"),
        "ttft_p99_ms": percentile(ttfts, 0.99) * 1000 if ttfts else float("nan"),
        "hit_requests": len(hit),
        "ttft_p50_hit_ms": percentile(hit, 0.5) * 1000,
        "ttft_p50_miss_ms": percentile(miss, 0.5) * 1000,
        "requests_s": len(inside) / window,
        "tokens_s": sum(tokens.values()) / window,
        "jain": jain_index(list(tokens.values())),
        "tenant_tokens": {slug: int(count) for slug, count in tokens.items()},
        "requests": len(inside),
        "errors": len(errors),
        "first_error": errors[0]["error"][:200] if errors else "",
        "prompt_tokens": max((r["prompt_tokens"] for r in inside), default=0),
    }


def print_rows(rows: list[dict[str, Any]]) -> None:
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
        print(
            f"{row['mode']}: {row['hit_requests']} of {row['requests']} requests found half "
            f"their prompt or more cached (usage cached_tokens), TTFT p50 "
            f"{row['ttft_p50_hit_ms']:.0f} ms; the others {row['ttft_p50_miss_ms']:.0f} ms"
        )
    for row in rows:
        if row["first_error"]:
            print(f"{row['mode']}: first error: {row['first_error']}")


def parse_load(text: str) -> Load:
    outstanding, _, think = text.partition(":")
    return Load(int(outstanding), float(think or 0))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="affinity,most-room")
    parser.add_argument(
        "--loads", default="1:0.5,2:0",
        help="OUTSTANDING:THINK_S,...: requests each tenant keeps open, mean think time",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=2, help="windows of each mode per load")
    parser.add_argument(
        "--model-shape", default="2,256,768",
        help="LAYERS,HIDDEN,INTERMEDIATE of the bench's model, or 'demo' for the demo model",
    )  # fmt: skip
    parser.add_argument("--kv-blocks", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=1500)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--warmup-s", type=float, default=10)
    parser.add_argument("--duration-s", type=float, default=40)
    parser.add_argument("--var-dir", default="/tmp/gpushare-cache-affinity/var")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/cache_affinity"),
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    args = parser.parse_args()
    args.modes = args.modes.split(",")
    if unknown := set(args.modes) - set(MODE_PORTS):
        parser.error(f"unknown modes: {', '.join(sorted(unknown))}")
    args.loads = [parse_load(text) for text in args.loads.split(",")]
    return args


def main() -> None:
    args = parse_args()
    print_header()
    model = model_dir(args)
    loads = "; ".join(load.describe() for load in args.loads)
    print(
        f"load:    {len(TENANTS)} tenants of weight 1, system prompt ~{args.prompt_tokens} "
        f"tokens, {args.max_tokens} output tokens; loads: {loads}; "
        f"{args.rounds} rounds of {args.duration_s:g} s windows after {args.warmup_s:g} s per "
        f"mode; engines {', '.join(ENGINES)} with {args.kv_blocks} KV blocks each, model "
        f"{model.name}",
        flush=True,
    )
    results: dict[tuple[Load, str], list[dict[str, Any]]] = {}
    with started_platform(args, model):
        keys = {slug: tenant_key(slug) for slug in TENANTS}
        for name in ENGINES:  # a manage.py call each, here and not inside the first window
            engine_key(name)
        for load in args.loads:
            for round_ in range(args.rounds):
                order = args.modes if round_ % 2 == 0 else args.modes[::-1]
                for mode in order:
                    result = asyncio.run(measured(keys, args, mode, load))
                    results.setdefault((load, mode), []).append(result)
                    row = summary(mode, load, [result])
                    print(
                        f"  window: load {load.label}, round {round_ + 1}, {mode}: hit rate "
                        f"{row['hit_rate']:.3f}, TTFT p50 {row['ttft_p50_ms']:.0f} ms, "
                        f"{row['tokens_s']:.1f} tok/s, Jain {row['jain']:.3f} (tokens by "
                        f"tenant: {' '.join(str(n) for n in row['tenant_tokens'].values())})",
                        flush=True,
                    )
    for load in args.loads:
        rows = [summary(mode, load, results[(load, mode)]) for mode in args.modes]
        for row in rows:
            print(json.dumps(row), flush=True)
        print(f"\nload {load.label}: {load.describe()}, {args.rounds} windows per mode\n")
        print_rows(rows)


if __name__ == "__main__":
    main()
