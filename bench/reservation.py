"""KV reservation by prediction against the worst case, on an engine whose KV binds: chat
without max_tokens and with max_tokens 256, at 8, 32 and 64 concurrent, through the platform
against the engine alone, once with GPUSHARE_KV_RESERVATION=worst and once with =predict.

For each mode the script starts a platform of its own (bench/common.py `bench_platform`: its
own SQLite database, Redis database 13 by default, flushed at the start, web, Celery worker
and beat, the engine agent, free ports; nothing of `make run` is touched), with the
environment variable GPUSHARE_KV_RESERVATION set to the mode, measures every cell, and stops
it. The mode is read where the platform starts, so one platform per mode.

The engine (stated at the top of every run, with what its /metrics say):

- model: scripts/make_long_answer_model.py's variant of the tiny demo Llama, built into
  var/models/reservation-llama by the vLLM interpreter: 4 layers x 8 KV heads x head_dim 128
  in bfloat16 = 16 KiB of KV per token (the demo model: 1 KiB), hidden size 128, so compute
  stays small; max_position_embeddings 8192.
- engine: `manage.py engine create rsv --units 4 --max-model-len 8192 --max-num-seqs 32`.
  4 units = 1 GiB = VLLM_CPU_KVCACHE_SPACE=1, the least a CPU engine can have (whole GiB,
  scheduler/engines/launch.py), holds 65,536 tokens: 8 requests at the model's full length,
  32 seats, as a GPU deployment is sized (Llama-3-8B on an 80 GB card: some 60 GB of KV at
  128 KiB a token, ~470k tokens, ~14 requests of 32k, 64-256 seats). A chat request without
  max_tokens may generate up to 8192 - prompt tokens, so the worst case reserves 8,192
  tokens (128 MiB): 8 at once. Alternatives checked: vLLM 0.32's CPU worker honours
  --kv-cache-memory-bytes (and --num-gpu-blocks-override is applied on any device), but the
  platform's launch (scheduler/engines/launch.py) passes neither, and VLLM_CPU_KVCACHE_SPACE
  (which it always sets) overrides the former; so the KV per token is made larger instead.
  The engine is the platform's own, in its own pool `rsv` (served model name = pool), in a
  database of its own: nothing depends on `demo`.
- answers end by themselves: the variant's lm_head gives EOS the same probability at every
  step, 1/--mean-output (default 1/200), so with temperature 1 (sent by every request)
  answers have a geometric length distribution of mean ~200 (p50 ~0.7x, p95 ~3x the mean),
  whatever max_tokens; the client never sends max_tokens in the `no-max` cells. Measured and
  printed as each mode's engine starts (which also warms it up): --length-requests requests
  at --max-num-seqs concurrent, straight to the engine, each to its end, the same seeds each
  time (on this machine: mean ~195, p50 ~125, p95 ~580, p99 ~1,240, max ~1,300 of 200, none
  cut at the model's length).

The load: 4 tenants of equal weight, new ones for every cell (rsv<cell>-t1..t4, made with
the services `manage.py tenant create` uses, as bench/seats.py makes its tenants, so that no
cell inherits the VTC counters or output lengths of the one before: class standard, quota
--quota-units each, default the engine's whole KV, so that quotas do not bind before the
engine does; burst 0), each keeping C/4 closed loops of streamed chat
(stream_options.include_usage) open for --warmup + --duration seconds, started in turn (t1,
t2, t3, t4, t1, ...). Each request is a distinct short prompt (~48 tokens with the chat
template: no prefix sharing), temperature 1, a sampling `seed` (each loop sends the same
sequence of seeds on every side and in every mode, so the engine alone and the platform get
the same answer lengths: without it, the length mix alone moved a cell's throughput by
10-20%), and either no max_tokens at all (kind `no-max`) or max_tokens --max-tokens (kind
`max`, shown as `max-256`). Requests still open when the window closes are abandoned (their
connections closed, so the server aborts them); then the script waits until the engine and
the fair queue are idle before the next cell. The same loops, with the same tenant split,
run straight to the engine's own OpenAI server (its URL and the key the platform derives for
it, scheduler/engines/auth.py, each request at the engine priority of class standard): the
engine alone. The client is the official `openai` package (AsyncOpenAI, one per tenant key,
max_retries 0) in asyncio, not `vllm bench serve`: vLLM's client always sends
max_completion_tokens (the dataset's output length; only --extra-body
'{"max_completion_tokens": null}' could blank it) and sends one API key and one global
concurrency limit per run, so it cannot keep 4 tenants' loops open with their own keys.

Per cell it prints (and writes to the JSON):

- throughput: completion tokens/s, the engine's own counter (vllm:generation_tokens_total)
  over the window, platform and engine alone, and their ratio; the client's count beside it
  (content chunks received in the window, per tenant, times the tokens per chunk of the
  cell's answers: the detokenizer holds back a token that ends inside a UTF-8 character, so
  with this random text a chunk carries ~1.35 tokens);
- requests the engine ran at once: vllm:num_requests_running sampled every --sample-every s
  in the window, mean and max (and waiting in the engine);
- preemptions per 1,000 requests: the delta of vllm:num_preemptions_total over the cell
  (warm-up and drain included) per request that ended in the cell; the summary adds them up
  over all of a mode's platform cells, since one cell has a few hundred requests;
- failures: every request that did not end well, by HTTP status and error code; those about
  memory (quota, KV, context length: insufficient_quota, request_too_large,
  context_length_exceeded, or a message naming KV, memory or quota) are counted apart;
- each tenant's quota in use against its real usage, in MiB, mean over the samples: in use
  is the fair queue's `tenant:<slug>:use` field `reserved` in Redis (the platform's
  GPUSHARE_SCHED_KEY_PREFIX, default gs:fq:); real usage is the KV its requests hold in the
  engine, from the client's side: for each of its requests that has received a token and not
  ended, prompt + tokens received so far (chunks x tokens per chunk), rounded up to the
  engine's block size, times the KV bytes per token (requests queued, or in prefill, count
  nothing). Beside it the engine's
  own total (vllm:kv_cache_usage_perc x capacity) as a check of that estimate, the engine's
  reservation (`engine:<id>:use` reserved) and, where the platform keeps one, each tenant's
  predicted output (`pool:<pool>:outpred`);
- fairness: Jain's index over the 4 tenants' completion tokens in the window;
- CPU: cores each process used in the window (engine with its core process, web, worker,
  beat, agent, redis-server, this client), from /proc.

Before any platform starts, the client's ceiling: the same loops at the highest concurrency
against bench/stand_in/instant.py (answers at once; it needs max_tokens, so 256), 5 s after
1 s (--no-ceiling skips it). The goals of the issue are checked at the end: without
max_tokens, predict's platform/alone ratio >= 0.95 at 32 and 64 concurrent (worst's beside
it), preemptions <= 1 per 1,000 requests, no request failed for memory, Jain >= 0.99.

    .venv/bin/python bench/reservation.py                                   # ~22 min
    .venv/bin/python bench/reservation.py --duration 10 --warmup 6 \\
        --length-requests 64                                                # ~10 min
    .venv/bin/python bench/reservation.py --modes worst --duration 10 --warmup 6 \\
        --length-requests 64                                                # ~5 min
    .venv/bin/python bench/reservation.py --engine-alone first              # ~18 min

The fair queue's own mode is printed with each platform cell (`reservation` on its engine in
Redis): a checkout without the predicted mode ignores GPUSHARE_KV_RESERVATION and runs the
worst case twice. On 2 cores the client, the platform, Redis and the engine share the CPU:
the engine gets ~1.2 cores, the client ~0.3-0.45, the platform ~0.1-0.15, and the engine's
throughput grows only ~1.3-1.5x from 8 to 32 running requests (a GPU's grows nearly
linearly), so the throughput the worst case loses here understates a GPU's; the running
counts are the direct measure. Cells where both sides run as many requests (c=8, and
max_tokens 256) put platform/alone between 0.95 and 1.12 in one run: a ratio is good to
about +-5-10% here, too coarse to tell 0.93 from 0.95. Rerun on a quiet machine before
quoting figures. Raw results (every cell, every sample) go to
var/bench/reservation-DATE/results.json, the platform's logs beside it (printed at the top).
Ctrl-C or SIGTERM stops what it started.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import shutil
import signal
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import ExitStack, suppress
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import httpx2
import openai
import redis
import redis.asyncio as aioredis
from common import (
    DEFAULT_REDIS_URL,
    REPO,
    BenchPlatform,
    bench_platform,
    cpu_seconds,
    jain_index,
    percentile,
)
from serve_bench import exit_on_sigterm, fmt, instant_server, print_header, vllm_python

from capacity.kvcost import kv_bytes_per_token  # common put the repository on the path
from fairqueue.keys import Keys
from protocol.classes import ENGINE_PRIORITY

ENGINE = "rsv"  # the engine's name, its served model name and its pool
TENANTS = ("t1", "t2", "t3", "t4")  # the loops' labels; each cell's tenants are new ones
MODES = ("worst", "predict")
KIND_NO_MAX = "no-max"
PROMPT = "Tell me a story about a lighthouse keeper and a storm."
REQUEST_CLASS = "standard"
KEYS = Keys("gs:fq:")  # the platform's GPUSHARE_SCHED_KEY_PREFIX default (bench_platform's)
MIB = 1024 * 1024
MEMORY_CODES = frozenset({"insufficient_quota", "request_too_large", "context_length_exceeded"})
MEMORY_WORDS = re.compile(r"kv cache|memory|quota", re.IGNORECASE)
METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
# What one cell costs beyond its warm-up and window, and a platform beyond its cells (start
# with migrations and the engine, stop), as measured on 2 cores: for the estimate.
CELL_OVERHEAD_S, PLATFORM_S = 2.0, 90.0
BEGAN = time.monotonic()


def elapsed() -> str:
    return f"[{(time.monotonic() - BEGAN) / 60:4.1f} min]"


def say(text: str) -> None:
    print(text, flush=True)


# --- the engine's /metrics ----------------------------------------------------------------


@dataclass
class Metrics:
    at: float
    values: dict[str, float]
    labels: dict[str, dict[str, str]]

    def get(self, name: str) -> float:
        return self.values.get(name, float("nan"))


def parse_metrics(text: str) -> tuple[dict[str, float], dict[str, dict[str, str]]]:
    """Every sample summed over its labels; the labels of the *_info metrics."""
    values: dict[str, float] = {}
    labels: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        match = METRIC.match(line)
        if not match or line.startswith("#"):
            continue
        name, label_text, raw = match.groups()
        try:
            value = float(raw)
        except ValueError:
            continue
        values[name] = values.get(name, 0.0) + value
        if name.endswith("_info") and label_text:
            labels[name] = dict(LABEL.findall(label_text))
    return values, labels


async def read_metrics(http: httpx.AsyncClient, url: str) -> Metrics:
    response = await http.get(f"{url}/metrics")
    response.raise_for_status()
    values, labels = parse_metrics(response.text)
    return Metrics(time.perf_counter(), values, labels)


# --- what is measured against --------------------------------------------------------------


@dataclass
class Engine:
    url: str
    auth: dict[str, str]
    block_size: int
    num_blocks: int
    bytes_per_token: int
    max_model_len: int
    max_num_seqs: int
    prompt_tokens: int  # of PROMPT as a chat message, by the engine's own count

    @property
    def capacity_tokens(self) -> int:
        return self.block_size * self.num_blocks

    def kv_bytes(self, tokens: int) -> int:
        """KV bytes `tokens` of one sequence hold: whole blocks."""
        return math.ceil(tokens / self.block_size) * self.block_size * self.bytes_per_token


@dataclass
class Target:
    """Where the loops go: the platform (tenants' keys) or the engine alone (its key)."""

    side: str  # "platform" or "alone"
    base_url: str  # ... /v1
    keys: dict[str, str]  # label -> API key
    headers: dict[str, str] = field(default_factory=dict)
    extra_body: dict[str, Any] | None = None
    slugs: dict[str, str] = field(default_factory=dict)  # label -> tenant (the platform's)


@dataclass
class Kind:
    name: str
    max_tokens: int | None


# --- closed loops of streamed chat --------------------------------------------------------


@dataclass
class Live:
    """A request in flight: content chunks received so far."""

    tenant: str
    chunks: int = 0


@dataclass
class Loops:
    target: Target
    model: str
    kind: Kind
    per_tenant: int
    open_at: float
    close_at: float
    live: dict[int, Live] = field(default_factory=dict)
    window_chunks: Counter[str] = field(default_factory=Counter)
    records: list[dict[str, Any]] = field(default_factory=list)
    # Tokens per content chunk and prompt tokens as answers so far say (the detokenizer holds
    # back tokens that end inside a UTF-8 character, so a chunk may carry several), seeded
    # with what was measured before.
    tokens_per_chunk: float = 1.0
    prompt_tokens: float = 0.0
    _seen_tokens: int = 0
    _seen_chunks: int = 0
    _seen_prompts: list[int] = field(default_factory=list)

    def held_tokens(self, live: Live) -> int:
        """Tokens a request in flight holds in the engine: its prompt and what it generated."""
        return round(self.prompt_tokens + live.chunks * self.tokens_per_chunk)

    def learn(self, record: dict[str, Any]) -> None:
        if record["ok"] and record["chunks"]:
            self._seen_tokens += record["completion_tokens"]
            self._seen_chunks += record["chunks"]
            self.tokens_per_chunk = self._seen_tokens / self._seen_chunks
        if record["ok"] and record["prompt_tokens"]:
            self._seen_prompts.append(record["prompt_tokens"])
            self.prompt_tokens = statistics.mean(self._seen_prompts[-200:])

    async def loop(self, tenant: str, index: int, client: openai.AsyncOpenAI) -> None:
        """One closed loop: the same sequence of requests (prompts and sampling seeds) for
        the same tenant label and index, on every side and in every mode."""
        rng = random.Random(f"{tenant}-{index}")
        while time.perf_counter() < self.close_at:
            record = await self.one(tenant, client, rng.randrange(2**31), index)
            if not record["ok"]:
                await asyncio.sleep(0.2)  # a refusal: do not spin

    async def one(
        self, tenant: str, client: openai.AsyncOpenAI, seed: int, index: int = 0
    ) -> dict[str, Any]:
        live = Live(tenant)
        self.live[id(live)] = live
        record: dict[str, Any] = {
            "tenant": tenant,
            "loop": index,
            "seed": seed,
            "ok": False,
            "status": 200,
            "code": "",
            "error": "",
            "sent": time.perf_counter(),
            "ended": 0.0,
            "chunks": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "finish_reason": "",
        }
        # A distinct first line per request: no prompt prefix shared between requests. The
        # seed makes the answer's length the same wherever the request is sent.
        content = f"Story {seed % 10**6:06d}: {PROMPT}"
        abandoned = False
        try:
            stream = await client.chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": content}],
                temperature=1.0,
                stream=True,
                stream_options={"include_usage": True},
                max_tokens=openai.omit if self.kind.max_tokens is None else self.kind.max_tokens,
                seed=seed,
                extra_body=self.target.extra_body,
            )
            async with stream:
                async for chunk in stream:
                    if chunk.choices:
                        choice = chunk.choices[0]
                        if choice.delta and choice.delta.content:
                            live.chunks += 1
                            if self.open_at <= time.perf_counter() < self.close_at:
                                self.window_chunks[tenant] += 1
                        if choice.finish_reason:
                            record["finish_reason"] = choice.finish_reason
                    if chunk.usage:
                        record["prompt_tokens"] = chunk.usage.prompt_tokens
                        record["completion_tokens"] = chunk.usage.completion_tokens
            record["ok"] = bool(record["finish_reason"]) or record["completion_tokens"] > 0
            if not record["ok"]:
                record["status"], record["code"] = 0, "no_answer"
        except asyncio.CancelledError:  # abandoned at the window's end: it did not end
            abandoned = True
            raise
        except openai.APIStatusError as exc:
            record["status"] = exc.status_code
            record["code"], record["error"] = error_code(exc.body, exc.message)
        except openai.APIConnectionError as exc:
            record["status"], record["code"] = 0, "connection"
            record["error"] = f"{exc.__class__.__name__}: {exc}"[:300]
        except openai.APIError as exc:  # an error event inside the stream
            record["status"] = 0
            record["code"], record["error"] = error_code(exc.body, exc.message)
            record["code"] = record["code"] or "stream_error"
        finally:
            del self.live[id(live)]
            record["chunks"] = live.chunks
            record["ended"] = time.perf_counter()
            if not abandoned:
                self.records.append(record)
                self.learn(record)
        return record


def error_code(body: object, message: str) -> tuple[str, str]:
    """The OpenAI-style error's code (or type) and message."""
    error = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = str(error.get("code") or error.get("type") or "")
        return code, str(error.get("message") or message)[:300]
    return "", str(message)[:300]


def is_memory_failure(record: dict[str, Any]) -> bool:
    return record["code"] in MEMORY_CODES or bool(MEMORY_WORDS.search(record["error"]))


def openai_clients(
    target: Target, http: httpx2.AsyncClient, tenants: Sequence[str]
) -> dict[str, openai.AsyncOpenAI]:
    return {
        tenant: openai.AsyncOpenAI(
            base_url=target.base_url,
            api_key=target.keys[tenant],
            default_headers=target.headers,
            max_retries=0,
            http_client=http,
        )
        for tenant in tenants
    }


def http_client(connections: int, request_timeout_s: float) -> httpx2.AsyncClient:
    """The openai clients' connections (openai 3 runs on httpx2, httpx's successor): idle
    ones let go after 2 s, before vLLM's server's 5 s keep-alive closes them (bench/common.py
    CLIENT_KEEPALIVE_S)."""
    limits = httpx2.Limits(
        max_connections=connections,
        max_keepalive_connections=connections,
        keepalive_expiry=2.0,
    )
    timeout = httpx2.Timeout(request_timeout_s, connect=30)
    return openai.DefaultAsyncHttpxClient(limits=limits, timeout=timeout)


# --- the samples ---------------------------------------------------------------------------


@dataclass
class Sampler:
    """Every --sample-every s in the window: the engine's running/waiting/KV in use, each
    tenant's KV really held (the client's side) and, through the platform, the fair queue's
    reservations."""

    engine: Engine
    loops: Loops
    fq: aioredis.Redis | None
    every: float
    rows: list[dict[str, Any]] = field(default_factory=list)

    def real_bytes(self) -> dict[str, int]:
        held = dict.fromkeys(TENANTS, 0)
        for live in list(self.loops.live.values()):
            if live.chunks:  # in the engine, past its prefill
                held[live.tenant] += self.engine.kv_bytes(self.loops.held_tokens(live))
        return held

    async def queue_view(self) -> dict[str, Any]:
        if self.fq is None:
            return {}
        slugs = self.loops.target.slugs
        pipe = self.fq.pipeline(transaction=False)
        for tenant in TENANTS:
            pipe.hgetall(KEYS.lease(ENGINE, slugs[tenant]))  # its pool is named as it is
        pipe.hgetall(KEYS.engine_usage(ENGINE, ENGINE))  # its pool is named as it is
        pipe.hgetall(KEYS.engine(ENGINE, ENGINE))
        pipe.hgetall(KEYS.output_predictions(ENGINE))
        *tenants, engine_use, engine, predicted = await pipe.execute()
        return {
            "tenant_use": {
                t: {k: float(v) for k, v in u.items()}
                for t, u in zip(TENANTS, tenants, strict=True)
            },
            "engine_reserved": float(engine_use.get("reserved") or 0),
            "engine_inflight": float(engine_use.get("inflight") or 0),
            "kv_budget": float(engine.get("kv_budget_bytes") or 0),
            "reservation": engine.get("reservation", ""),
            "predicted": {t: float(predicted[s]) for t, s in slugs.items() if s in predicted},
        }

    async def run(self, http: httpx.AsyncClient) -> None:
        await asyncio.sleep(max(0.0, self.loops.open_at - time.perf_counter()))
        while time.perf_counter() < self.loops.close_at:
            started = time.perf_counter()
            real = self.real_bytes()
            try:
                metrics = await read_metrics(http, self.engine.url)
                queue = await self.queue_view()
            except (httpx.HTTPError, redis.RedisError) as exc:
                say(f"    (a sample failed: {exc.__class__.__name__}: {exc})")
            else:
                self.rows.append(
                    {
                        "t": started - self.loops.open_at,
                        "running": metrics.get("vllm:num_requests_running"),
                        "waiting": metrics.get("vllm:num_requests_waiting"),
                        "kv_usage": metrics.get("vllm:kv_cache_usage_perc"),
                        "real_bytes": real,
                        **queue,
                    }
                )
            await asyncio.sleep(max(0.0, started + self.every - time.perf_counter()))


# --- one cell -------------------------------------------------------------------------------


@dataclass
class Cell:
    mode: str
    side: str
    kind: str
    concurrency: int
    window_s: float = 0.0
    generated: float = 0.0  # the engine's generation_tokens_total over the window
    client_tokens: dict[str, float] = field(default_factory=dict)  # per tenant, in the window
    tokens_per_chunk: float = float("nan")
    ended: int = 0  # requests that ended in the cell (answered or failed)
    ok: int = 0
    abandoned: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    memory_failures: int = 0
    first_errors: list[str] = field(default_factory=list)
    preemptions: float = 0.0
    running_mean: float = float("nan")
    running_max: float = float("nan")
    waiting_mean: float = float("nan")
    engine_kv_mib: float = float("nan")  # kv_cache_usage_perc x capacity, mean
    real_kv_mib: float = float("nan")  # the client's estimate, all tenants, mean
    engine_reserved_mib: float = float("nan")
    kv_budget_mib: float = float("nan")
    quota_mib: dict[str, float] = field(default_factory=dict)  # tenant -> reserved, mean
    real_mib: dict[str, float] = field(default_factory=dict)  # tenant -> real, mean
    predicted: dict[str, float] = field(default_factory=dict)  # tenant -> tokens, last
    reservation: str = ""  # the engine's mode as the fair queue has it, where it says
    output_mean: float = float("nan")
    output_p95: float = float("nan")
    settle_s: float = 0.0
    tenants: dict[str, str] = field(default_factory=dict)  # label -> the platform's tenant
    ended_by_tenant: dict[str, int] = field(default_factory=dict)
    vtc: dict[str, float] = field(default_factory=dict)  # the fair queue's counters at the end
    # The fair queue's view as the window opens and closes (see `fair_queue_view`).
    queue_at_open: dict[str, Any] = field(default_factory=dict)
    queue_at_close: dict[str, Any] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)  # process -> cores used in the window
    samples: list[dict[str, Any]] = field(default_factory=list)
    # Every request that ended: times in s from the window's opening.
    requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def throughput(self) -> float:
        return self.generated / self.window_s if self.window_s else float("nan")

    @property
    def client_throughput(self) -> float:
        total = sum(self.client_tokens.values())
        return total / self.window_s if self.window_s else float("nan")

    @property
    def jain(self) -> float:
        return jain_index([self.client_tokens.get(t, 0.0) for t in TENANTS])

    @property
    def per_1000(self) -> float:
        return 1000 * self.preemptions / self.ended if self.ended else float("nan")

    def line(self) -> str:
        failed = sum(self.failures.values())
        text = (
            f"{self.throughput:6.0f} tok/s (client {self.client_throughput:.0f}); running "
            f"mean {fmt(self.running_mean, 0)} max {fmt(self.running_max, 0, 0)}, waiting "
            f"{fmt(self.waiting_mean, 0)}; KV held {fmt(self.engine_kv_mib, 0, 0)} MiB "
            f"(client's estimate {fmt(self.real_kv_mib, 0, 0)})"
        )
        if self.side == "platform":
            text += (
                f", reserved {fmt(self.engine_reserved_mib, 0, 0)} of "
                f"{fmt(self.kv_budget_mib, 0, 0)} MiB"
            )
        text += (
            f"; preemptions {self.preemptions:.0f} in {self.ended} requests "
            f"({fmt(self.per_1000, 0, 1)}/1k); failed {failed}"
            + (f" ({self.memory_failures} for memory)" if failed else "")
            + f"; Jain {fmt(self.jain, 0, 3)}; answers mean {fmt(self.output_mean, 0, 0)} "
            f"p95 {fmt(self.output_p95, 0, 0)}"
        )
        if self.side == "platform":
            quota = ", ".join(
                f"{t} {fmt(self.quota_mib.get(t, float('nan')), 0, 0)}/"
                f"{fmt(self.real_mib.get(t, float('nan')), 0, 0)}"
                for t in TENANTS
            )
            text += f"\n        quota in use / real usage, MiB: {quota}"
            if self.predicted:
                said = ", ".join(f"{t} {v:.0f}" for t, v in self.predicted.items())
                text += f"; predicted output: {said} tokens"
            if self.reservation:
                text += f"; fair queue's reservation mode: {self.reservation}"
        if self.cpu:
            cores = ", ".join(f"{name} {used:.2f}" for name, used in self.cpu.items())
            text += f"\n        CPU cores in the window: {cores}"
        for error in self.first_errors:
            text += f"\n        error: {error}"
        return text


async def fair_queue_view(fq: aioredis.Redis | None, slugs: dict[str, str]) -> dict[str, Any]:
    """Per tenant label: its VTC counter, its score in the backlog (absent: not backlogged)
    and its jobs waiting; and the class's `vtcseated` stamp. For the JSON, to see why a
    cell's shares came out as they did."""
    if fq is None:
        return {}
    pool, cls = ENGINE, REQUEST_CLASS
    counters = await fq.hgetall(KEYS.counters(pool, cls))
    scores = await fq.zrange(KEYS.backlog(pool, cls), 0, -1, withscores=True)
    backlog = {str(pair[0]): float(pair[1]) for pair in scores}
    waiting = {t: await fq.llen(KEYS.queue(pool, cls, s)) for t, s in slugs.items()}
    return {
        "vtc": {t: float(counters.get(s) or 0) for t, s in slugs.items()},
        "backlog": {t: backlog[s] for t, s in slugs.items() if s in backlog},
        "waiting": waiting,
        "seated": float(await fq.get(KEYS.seated(pool, cls)) or 0),
    }


def cpu_sample(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each process (with its children: the engine's core process)
    and of this one (the client)."""
    return {name: cpu_seconds(pid) for name, pid in pids.items()} | {"client": time.process_time()}


def mean_of(values: Sequence[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.mean(values) if values else float("nan")


async def settle(
    http: httpx.AsyncClient,
    engine: Engine,
    fq: aioredis.Redis | None,
    slugs: Sequence[str],
    timeout_s: float,
) -> float:
    """Waits until the engine runs and holds nothing and the fair queue holds no
    reservation of the bench's tenants; returns how long that took."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        metrics = await read_metrics(http, engine.url)
        busy = metrics.get("vllm:num_requests_running") + metrics.get("vllm:num_requests_waiting")
        if fq is not None:
            for slug in slugs:
                busy += float(await fq.hget(KEYS.lease(ENGINE, slug), "held") or 0)
            busy += float(await fq.hget(KEYS.engine_usage(ENGINE, ENGINE), "inflight") or 0)
        if busy == 0:
            return time.perf_counter() - start
        await asyncio.sleep(0.5)
    say(f"    (not idle after {timeout_s:.0f} s: going on)")
    return time.perf_counter() - start


async def run_cell(
    args: argparse.Namespace,
    engine: Engine,
    target: Target,
    kind: Kind,
    concurrency: int,
    mode: str,
    redis_url: str | None,
    seen: dict[str, Any],
    pids: dict[str, int],
) -> Cell:
    per_tenant = max(1, concurrency // len(TENANTS))
    fq = aioredis.Redis.from_url(redis_url, decode_responses=True) if redis_url else None
    cell = Cell(mode, target.side, kind.name, per_tenant * len(TENANTS))
    async with (
        http_client(concurrency + 8, args.request_timeout) as http,
        httpx.AsyncClient(timeout=10, headers=engine.auth) as probe,
    ):
        before = await read_metrics(probe, engine.url)
        start = time.perf_counter()
        loops = Loops(
            target,
            ENGINE,
            kind,
            per_tenant,
            start + args.warmup,
            start + args.warmup + args.duration,
        )
        loops.tokens_per_chunk = float(seen.get("tokens_per_chunk") or 1.0)
        loops.prompt_tokens = float(seen.get("prompt_tokens") or engine.prompt_tokens)
        clients = openai_clients(target, http, TENANTS)
        # Started in turn (t1, t2, t3, t4, t1, ...), so no tenant's requests all come first.
        tasks = [
            asyncio.create_task(loops.loop(tenant, index, clients[tenant]))
            for index in range(per_tenant)
            for tenant in TENANTS
        ]
        sampler = Sampler(engine, loops, fq, args.sample_every)
        sampling = asyncio.create_task(sampler.run(probe))
        try:
            await asyncio.sleep(max(0.0, loops.open_at - time.perf_counter()))
            opened = await read_metrics(probe, engine.url)
            cell.queue_at_open = await fair_queue_view(fq, target.slugs)
            cpu_before = cpu_sample(pids)
            await asyncio.sleep(max(0.0, loops.close_at - time.perf_counter()))
            closed = await read_metrics(probe, engine.url)
            cpu_after = cpu_sample(pids)
            cell.queue_at_close = await fair_queue_view(fq, target.slugs)
            window = closed.at - opened.at
            cell.cpu = {n: (cpu_after[n] - cpu_before[n]) / window for n in cpu_before}
        finally:
            cell.abandoned = len(loops.live)
            for task in [*tasks, sampling]:
                task.cancel()
            await asyncio.gather(*tasks, sampling, return_exceptions=True)
        cell.settle_s = await settle(
            probe, engine, fq, list(target.slugs.values()), args.settle_timeout
        )
        after = await read_metrics(probe, engine.url)
    if fq is not None:
        cell.vtc = (await fair_queue_view(fq, target.slugs))["vtc"]
        await fq.aclose()
    cell.tenants = dict(target.slugs)
    summarize_cell(cell, engine, loops, sampler.rows, (before, opened, closed, after))
    return cell


def summarize_cell(
    cell: Cell,
    engine: Engine,
    loops: Loops,
    rows: list[dict[str, Any]],
    reads: tuple[Metrics, Metrics, Metrics, Metrics],
) -> None:
    before, opened, closed, after = reads
    cell.window_s = closed.at - opened.at
    gen = "vllm:generation_tokens_total"
    cell.generated = closed.get(gen) - opened.get(gen)
    preempted = "vllm:num_preemptions_total"
    cell.preemptions = after.get(preempted) - before.get(preempted)
    records = loops.records
    ok = [r for r in records if r["ok"]]
    cell.ended, cell.ok = len(records), len(ok)
    cell.ended_by_tenant = dict(Counter(r["tenant"] for r in records))
    chunks = sum(r["chunks"] for r in ok)
    tokens = sum(r["completion_tokens"] for r in ok)
    # The platform or the detokenizer may put several tokens in one chunk: scale the
    # window's chunk counts by the tokens per chunk of the answers that ended.
    cell.tokens_per_chunk = tokens / chunks if chunks else 1.0
    scale = cell.tokens_per_chunk if cell.tokens_per_chunk == cell.tokens_per_chunk else 1.0
    cell.client_tokens = {t: loops.window_chunks.get(t, 0) * scale for t in TENANTS}
    failed = [r for r in records if not r["ok"]]
    cell.failures = dict(Counter(f"{r['status']} {r['code'] or 'error'}" for r in failed))
    cell.memory_failures = sum(1 for r in failed if is_memory_failure(r))
    seen: list[str] = []
    for r in failed:
        text = f"{r['status']} {r['code']}: {r['error']}"[:240]
        if text not in seen and len(seen) < 3:
            seen.append(text)
    cell.first_errors = seen
    lengths = [r["completion_tokens"] for r in ok]
    cell.output_mean = mean_of(lengths)
    cell.output_p95 = percentile(lengths, 0.95)
    capacity_mib = engine.capacity_tokens * engine.bytes_per_token / MIB
    cell.running_mean = mean_of([r["running"] for r in rows])
    cell.running_max = max((r["running"] for r in rows), default=float("nan"))
    cell.waiting_mean = mean_of([r["waiting"] for r in rows])
    cell.engine_kv_mib = mean_of([r["kv_usage"] * capacity_mib for r in rows])
    cell.real_kv_mib = mean_of([sum(r["real_bytes"].values()) / MIB for r in rows])
    cell.real_mib = {t: mean_of([r["real_bytes"][t] / MIB for r in rows]) for t in TENANTS}
    if rows and "tenant_use" in rows[0]:
        cell.quota_mib = {
            t: mean_of([r["tenant_use"][t].get("held", 0.0) / MIB for r in rows]) for t in TENANTS
        }
        cell.engine_reserved_mib = mean_of([r["engine_reserved"] / MIB for r in rows])
        cell.kv_budget_mib = mean_of([r["kv_budget"] / MIB for r in rows])
        cell.predicted = rows[-1]["predicted"]
        cell.reservation = rows[-1]["reservation"]
    cell.samples = rows
    cell.requests = [
        {**r, "sent": r["sent"] - loops.open_at, "ended": r["ended"] - loops.open_at}
        for r in records
    ]


# --- the output-length distribution and the client's ceiling --------------------------------


async def measure_lengths(
    args: argparse.Namespace, engine: Engine, target: Target
) -> dict[str, Any]:
    """--length-requests answers without max_tokens, --max-num-seqs at once, each to its end."""
    kind = Kind(KIND_NO_MAX, None)
    far = time.perf_counter() + 10**6
    async with http_client(args.max_num_seqs + 4, args.request_timeout) as http:
        loops = Loops(target, ENGINE, kind, 1, far, far)
        client = openai_clients(target, http, TENANTS[:1])[TENANTS[0]]
        gate = asyncio.Semaphore(args.max_num_seqs)

        async def one(seed: int) -> None:
            async with gate:
                await loops.one(TENANTS[0], client, seed)

        started = time.perf_counter()
        seeds = random.Random("lengths")
        await asyncio.gather(*(one(seeds.randrange(2**31)) for _ in range(args.length_requests)))
        wall = time.perf_counter() - started
    ok = [r for r in loops.records if r["ok"]]
    lengths = sorted(r["completion_tokens"] for r in ok)
    chunks = sum(r["chunks"] for r in ok)
    return {
        "requests": len(loops.records),
        "ok": len(ok),
        "mean": mean_of(lengths),
        "p50": percentile(lengths, 0.5),
        "p90": percentile(lengths, 0.9),
        "p95": percentile(lengths, 0.95),
        "p99": percentile(lengths, 0.99),
        "max": lengths[-1] if lengths else float("nan"),
        "cut_at_length": sum(1 for r in ok if r["finish_reason"] == "length"),
        "prompt_tokens": mean_of([r["prompt_tokens"] for r in ok]),
        "tokens_per_chunk": sum(lengths) / chunks if chunks else float("nan"),
        "wall_s": wall,
        "lengths": lengths,
    }


async def measure_ceiling_async(args: argparse.Namespace, url: str) -> dict[str, Any]:
    concurrency = max(args.concurrencies)
    per_tenant = max(1, concurrency // len(TENANTS))
    target = Target("stand-in", f"{url}/v1", dict.fromkeys(TENANTS, "ceiling"))
    start = time.perf_counter()
    loops = Loops(target, "demo", Kind("max-256", 256), per_tenant, start + 1.0, start + 6.0)
    async with http_client(concurrency + 8, args.request_timeout) as http:
        clients = openai_clients(target, http, TENANTS)
        await asyncio.gather(
            *(loops.loop(t, i, clients[t]) for i in range(per_tenant) for t in TENANTS)
        )
    window = loops.close_at - loops.open_at
    ended = [r for r in loops.records if loops.open_at <= r["ended"] < loops.close_at]
    return {
        "concurrency": per_tenant * len(TENANTS),
        "requests_per_s": sum(1 for r in ended if r["ok"]) / window,
        "tokens_per_s": sum(loops.window_chunks.values()) / window,
        "failed": sum(1 for r in loops.records if not r["ok"]),
    }


def measure_ceiling(args: argparse.Namespace) -> dict[str, Any]:
    concurrency = max(args.concurrencies)
    say(
        f"\n{elapsed()} client ceiling: {concurrency} loops of streamed chat (max_tokens 256) "
        "against bench/stand_in/instant.py (answers at once), 5 s after 1 s"
    )
    with instant_server(args.stand_in_port) as url:
        ceiling = asyncio.run(measure_ceiling_async(args, url))
    say(
        f"  {ceiling['tokens_per_s']:.0f} completion tokens/s, {ceiling['requests_per_s']:.1f} "
        f"requests/s, {ceiling['failed']} failed"
    )
    return ceiling


# --- one platform per mode -------------------------------------------------------------------


def build_model(args: argparse.Namespace, python: str) -> Path:
    folder = (REPO / "var" / "models" / "reservation-llama").resolve()
    command = [
        python,
        str(REPO / "scripts" / "make_long_answer_model.py"),
        str(folder),
        "--layers",
        str(args.layers),
        "--kv-heads",
        str(args.kv_heads),
        "--head-dim",
        str(args.head_dim),
        "--max-len",
        str(args.max_model_len),
        "--mean-output",
        repr(args.mean_output),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"scripts/make_long_answer_model.py failed:\n{done.stderr[-2000:]}")
    return folder


async def engine_facts(
    args: argparse.Namespace, url: str, auth: dict[str, str], model: Path
) -> Engine:
    async with httpx.AsyncClient(timeout=30, headers=auth) as http:
        metrics = await read_metrics(http, url)
        info = metrics.labels.get("vllm:cache_config_info", {})
        counted = await http.post(
            f"{url}/tokenize",
            json={
                "model": ENGINE,
                "messages": [{"role": "user", "content": f"Story 123456: {PROMPT}"}],
                "add_generation_prompt": True,
            },
        )
        counted.raise_for_status()
    return Engine(
        url=url,
        auth=auth,
        block_size=int(info.get("block_size") or 16),
        num_blocks=int(info.get("num_gpu_blocks") or 0),
        bytes_per_token=kv_bytes_per_token(model),
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        prompt_tokens=int(counted.json()["count"]),
    )


def print_engine(engine: Engine, mode: str) -> None:
    capacity = engine.capacity_tokens
    say(
        f"engine {ENGINE} ({mode}): KV {capacity:,} tokens ({engine.num_blocks} blocks of "
        f"{engine.block_size}) x {engine.bytes_per_token // 1024} KiB = "
        f"{capacity * engine.bytes_per_token / MIB:.0f} MiB; max_model_len "
        f"{engine.max_model_len:,} ({capacity / engine.max_model_len:.2f} requests at full "
        f"length); {engine.max_num_seqs} seats; prompt {engine.prompt_tokens} tokens"
    )


def measure_mode(
    args: argparse.Namespace,
    mode: str,
    model: Path,
    results: dict[str, Any],
    save: Callable[[], None],
) -> None:
    say(f"\n{elapsed()} == mode {mode}: a platform with GPUSHARE_KV_RESERVATION={mode}")
    env = {"GPUSHARE_KV_RESERVATION": mode, "GPUSHARE_DEMO_MODEL_DIR": str(model)}
    with bench_platform(
        redis_url=args.redis_url,
        model=ENGINE,
        units=4 * args.kv_gib,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        env=env,
    ) as bench:
        logs = args.result_dir / f"platform-{mode}"
        try:
            engine = asyncio.run(engine_facts(args, bench.engine_url, bench.engine_auth, model))
            print_engine(engine, mode)
            results["engines"][mode] = {k: v for k, v in asdict(engine).items() if k != "auth"}
            quota = args.quota_units if args.quota_units else 4 * args.kv_gib
            cells = [(k, c) for k in kinds(args) for c in args.concurrencies]
            tenants = create_tenants(bench, len(cells), quota)
            first = ", ".join(slug for slug, _ in tenants[0].values())
            say(
                f"tenants: {len(TENANTS)} new ones per cell ({first}, "
                f"...): weight 1, quota {quota} units ({quota * 256} MiB) each, burst 0, class "
                f"{REQUEST_CLASS}"
            )
            alone = Target(
                "alone",
                f"{engine.url}/v1",
                dict.fromkeys(TENANTS, engine.auth["Authorization"][7:]),
                extra_body={"priority": ENGINE_PRIORITY[REQUEST_CLASS]},
            )
            seen: dict[str, Any] = {}
            if args.length_requests:  # in every mode: it also warms the new engine up
                say(
                    f"{elapsed()} output lengths without max_tokens: {args.length_requests} "
                    f"requests, {args.max_num_seqs} at once, straight to the engine"
                )
                seen = asyncio.run(measure_lengths(args, engine, alone))
                results.setdefault("lengths", {})[mode] = seen
                print_lengths(seen)
                save()
            pids = process_ids(bench)
            say(f"processes for CPU: {', '.join(f'{n} {p}' for n, p in pids.items())}")
            for (kind, concurrency), mine in zip(cells, tenants, strict=True):
                platform = Target(
                    "platform",
                    f"{bench.platform.base_url}/v1",
                    {label: key for label, (_, key) in mine.items()},
                    headers={"X-Request-Class": REQUEST_CLASS},
                    slugs={label: slug for label, (slug, _) in mine.items()},
                )
                with_alone = args.engine_alone == "each" or mode == args.modes[0]
                for target in [alone, platform] if with_alone else [platform]:
                    label = f"{mode:<7} {kind.name:<7} c={concurrency:<3} {target.side:<8}"
                    say(f"  {elapsed()} {label} ...")
                    redis_url = args.redis_url if target.side == "platform" else None
                    cell = asyncio.run(
                        run_cell(
                            args, engine, target, kind, concurrency, mode, redis_url, seen, pids
                        )
                    )
                    say(f"    {cell.line()}")
                    results["cells"].setdefault(target.side, []).append(asdict(cell))
                    save()
        finally:
            keep_logs(bench.platform.workdir, logs)


def process_ids(bench: BenchPlatform) -> dict[str, int]:
    """The engine's process (its core process is a child of it), the platform's and Redis."""
    engine_pid = bench.shell(
        "import json; from scheduler.models import Engine; "
        f"print(json.dumps(Engine.objects.get(name={ENGINE!r}).pid))"
    )
    found = {"engine": int(engine_pid)} if engine_pid else {}
    return found | bench.pids()


def create_tenants(
    bench: BenchPlatform, cells: int, quota_units: int
) -> list[dict[str, tuple[str, str]]]:
    """For each cell, 4 new tenants of equal weight with a key each (label -> (slug, key)),
    all made in one Django shell with the services `manage.py tenant create` uses: a cell
    starts with no fair-queue history (VTC counters, output lengths) of the cells before."""
    slugs = [[f"rsv{cell}-{label}" for label in TENANTS] for cell in range(cells)]
    code = (
        "import json\n"
        "from tenants import services\n"
        "keys = {}\n"
        f"for slug in {[s for row in slugs for s in row]!r}:\n"
        f"    tenant = services.tenant_create(slug=slug, weight=1.0, quota_units={quota_units},"
        f" burst_units=0, allowed_classes=[{REQUEST_CLASS!r}])\n"
        "    keys[slug] = services.api_key_create(tenant=tenant, name='reservation').raw_key\n"
        "print(json.dumps(keys))\n"
    )
    keys = bench.shell(code)
    return [
        {label: (slug, keys[slug]) for label, slug in zip(TENANTS, row, strict=True)}
        for row in slugs
    ]


def kinds(args: argparse.Namespace) -> list[Kind]:
    """--kinds as measured: `no-max`, and `max` named after its max_tokens."""
    return [
        Kind(KIND_NO_MAX, None)
        if name == KIND_NO_MAX
        else Kind(f"max-{args.max_tokens}", args.max_tokens)
        for name in args.kinds
    ]


def keep_logs(workdir: Path, into: Path) -> None:
    """The platform's and the engine's logs, before bench_platform's workdir is left."""
    into.mkdir(parents=True, exist_ok=True)
    for path in [
        *workdir.glob("*.log"),
        *workdir.glob("engines/*.log"),
        *workdir.glob("log/*.log"),
    ]:
        with suppress(OSError):
            shutil.copy(path, into / path.name)


# --- the report ------------------------------------------------------------------------------


def print_lengths(lengths: dict[str, Any]) -> None:
    say(
        f"  output tokens: mean {lengths['mean']:.0f}, p50 {lengths['p50']:.0f}, p90 "
        f"{lengths['p90']:.0f}, p95 {lengths['p95']:.0f}, p99 {lengths['p99']:.0f}, max "
        f"{lengths['max']:.0f} ({lengths['ok']} of {lengths['requests']} answered, "
        f"{lengths['cut_at_length']} cut at the model's length); prompt "
        f"{lengths['prompt_tokens']:.0f} tokens; {lengths['tokens_per_chunk']:.2f} tokens per "
        f"streamed chunk; {lengths['wall_s']:.0f} s"
    )


def find(
    cells: list[dict[str, Any]], mode: str | None, kind: str, concurrency: int
) -> dict[str, Any] | None:
    for cell in cells:
        if (
            (mode is None or cell["mode"] == mode)
            and cell["kind"] == kind
            and cell["concurrency"] == concurrency
        ):
            return cell
    return None


def throughput(cell: dict[str, Any] | None) -> float:
    if not cell or not cell["window_s"]:
        return float("nan")
    return float(cell["generated"]) / float(cell["window_s"])


def jain_of(cell: dict[str, Any] | None) -> float:
    if not cell:
        return float("nan")
    return jain_index([cell["client_tokens"].get(t, 0.0) for t in TENANTS])


def print_summary(args: argparse.Namespace, results: dict[str, Any]) -> None:
    alone_cells = results["cells"].get("alone", [])
    platform_cells = results["cells"].get("platform", [])
    modes = [m for m in args.modes if any(c["mode"] == m for c in platform_cells)]
    if not modes:
        return
    say(
        "\n== summary (completion tokens/s by the engine's counter; running: requests the engine "
        "ran at once, mean/max; ratio: platform / engine alone of the same mode's platform)"
    )
    head = f"{'kind':<8}{'conc':>5} |{'alone':>7}"
    for mode in modes:
        head += f" |{mode + ' tok/s':>13}{'ratio':>6}{'running':>10}{'pre/1k':>7}"
        head += f"{'fail':>5}{'mem':>4}{'Jain':>7}"
    say(head)
    for kind in [k.name for k in kinds(args)]:
        for concurrency in args.concurrencies:
            count = max(1, concurrency // len(TENANTS)) * len(TENANTS)
            row = f"{kind:<8}{count:>5} |"
            base = find(alone_cells, None, kind, count)
            row += fmt(throughput(base), 7, 0)
            for mode in modes:
                cell = find(platform_cells, mode, kind, count)
                here = find(alone_cells, mode, kind, count) or base
                if cell is None:
                    row += f" |{'-':>13}{'':>6}{'':>10}{'':>7}{'':>5}{'':>4}{'':>7}"
                    continue
                ratio = throughput(cell) / throughput(here) if here else float("nan")
                running = f"{cell['running_mean']:.1f}/{cell['running_max']:.0f}"
                per_1000 = (
                    1000 * cell["preemptions"] / cell["ended"] if cell["ended"] else float("nan")
                )
                row += (
                    f" |{fmt(throughput(cell), 13, 0)}{fmt(ratio, 6, 2)}{running:>10}"
                    f"{fmt(per_1000, 7, 1)}{sum(cell['failures'].values()):5d}"
                    f"{cell['memory_failures']:4d}{fmt(jain_of(cell), 7, 3)}"
                )
            say(row)
    say(
        "engine alone, running mean/max: "
        + "; ".join(
            f"{c['mode']} {c['kind']} c={c['concurrency']} "
            f"{c['running_mean']:.1f}/{c['running_max']:.0f}"
            for c in alone_cells
        )
    )
    say("\nquota in use / real usage per tenant (MiB, mean over the samples), platform cells:")
    for cell in platform_cells:
        pairs = ", ".join(
            f"{t} {fmt(cell['quota_mib'].get(t, float('nan')), 0, 0)}/"
            f"{fmt(cell['real_mib'].get(t, float('nan')), 0, 0)}"
            for t in TENANTS
        )
        total_q = sum(cell["quota_mib"].values())
        total_r = sum(cell["real_mib"].values())
        over = total_q / total_r if total_r else float("nan")
        say(
            f"  {cell['mode']:<7} {cell['kind']:<7} c={cell['concurrency']:<3} {pairs} "
            f"(in use / real x{fmt(over, 0, 1)}; engine's own KV in use "
            f"{fmt(cell['engine_kv_mib'], 0, 0)})"
        )
    say(
        "\nCPU cores used in the window: engine | platform (web, worker, beat, agent) | "
        "redis | client"
    )
    for cell in [*alone_cells, *platform_cells]:
        cpu = cell.get("cpu") or {}
        platform = sum(cpu.get(n, 0.0) for n in ("web", "worker", "beat", "agent"))
        say(
            f"  {cell['mode']:<7} {cell['kind']:<7} c={cell['concurrency']:<3} {cell['side']:<8} "
            f"{cpu.get('engine', float('nan')):5.2f} | {platform:5.2f} | "
            f"{cpu.get('redis', float('nan')):5.2f} | {cpu.get('client', float('nan')):5.2f}"
        )
    print_goals(args, modes, alone_cells, platform_cells)


def print_goals(
    args: argparse.Namespace,
    modes: list[str],
    alone_cells: list[dict[str, Any]],
    platform_cells: list[dict[str, Any]],
) -> None:
    say("\n== goals")
    for mode in modes:
        mine = [c for c in platform_cells if c["mode"] == mode]
        ended = sum(c["ended"] for c in mine)
        preempted = sum(c["preemptions"] for c in mine)
        per_1000 = 1000 * preempted / ended if ended else float("nan")
        memory = sum(c["memory_failures"] for c in mine)
        failed = sum(sum(c["failures"].values()) for c in mine)
        jains = [jain_of(c) for c in mine]
        low = min(jains) if jains else float("nan")
        say(
            f"{mode}: preemptions {preempted:.0f} in {ended} requests = {per_1000:.2f}/1k "
            f"({'met' if per_1000 <= 1 else 'NOT met'}: <= 1); failed {failed}, {memory} for "
            f"memory ({'met' if memory == 0 else 'NOT met'}: none); lowest Jain {low:.3f} "
            f"({'met' if low >= 0.99 else 'NOT met'}: >= 0.99)"
        )
    for concurrency in (32, 64):
        count = max(1, concurrency // len(TENANTS)) * len(TENANTS)
        if count not in args.concurrencies or KIND_NO_MAX not in args.kinds:
            continue
        parts = []
        for mode in modes:
            cell = find(platform_cells, mode, KIND_NO_MAX, count)
            here = find(alone_cells, mode, KIND_NO_MAX, count) or find(
                alone_cells, None, KIND_NO_MAX, count
            )
            ratio = throughput(cell) / throughput(here) if cell and here else float("nan")
            parts.append(f"{mode} {fmt(ratio, 0, 2)}")
        predict = next((p for p in parts if p.startswith("predict")), None)
        verdict = ""
        if predict:
            value = float(predict.split()[1]) if predict.split()[1] != "-" else float("nan")
            verdict = f" ({'met' if value >= 0.95 else 'NOT met'}: predict >= 0.95)"
        say(
            f"without max_tokens at {count} concurrent, platform/alone: {', '.join(parts)}{verdict}"
        )


# --- main ---------------------------------------------------------------------------------------


def numbers(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: whole numbers separated by commas") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: one or more numbers over 0")
    return values


def choices(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        chosen = [part.strip() for part in text.split(",") if part.strip()]
        if not chosen or any(part not in allowed for part in chosen):
            raise argparse.ArgumentTypeError(f"{text!r}: one or more of {', '.join(allowed)}")
        return chosen

    return parse


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="See the top of bench/reservation.py for what is measured and how.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    load = parser.add_argument_group("the load")
    load.add_argument(
        "--modes",
        type=choices(MODES),
        default="worst,predict",
        help="GPUSHARE_KV_RESERVATION values, one platform each, in this order",
    )
    load.add_argument(
        "--kinds",
        type=choices((KIND_NO_MAX, "max")),
        default="no-max,max",
        help="no-max: chat without max_tokens; max: with --max-tokens",
    )
    load.add_argument("--max-tokens", type=int, default=256, help="max_tokens of kind max")
    load.add_argument(
        "--concurrencies",
        type=numbers,
        default="8,32,64",
        help="open requests, all tenants together (C/4 each)",
    )
    load.add_argument("--warmup", type=float, default=10.0, help="s of load before each window")
    load.add_argument("--duration", type=float, default=35.0, help="s measured per cell")
    load.add_argument(
        "--engine-alone",
        choices=("each", "first"),
        default="each",
        help="the engine-alone cells in every mode's platform, or only the first's",
    )
    load.add_argument(
        "--length-requests",
        type=int,
        default=200,
        help="answers measured for the output lengths (0: skip)",
    )
    load.add_argument("--sample-every", type=float, default=0.5, help="s between samples")
    load.add_argument(
        "--settle-timeout",
        type=float,
        default=120.0,
        help="s to wait for an idle engine and queue after a cell",
    )
    load.add_argument("--request-timeout", type=float, default=600.0, help="s per request")
    engine = parser.add_argument_group("the engine and its model")
    engine.add_argument("--max-model-len", type=int, default=8192)
    engine.add_argument("--max-num-seqs", type=int, default=32, help="the engine's seats")
    engine.add_argument("--kv-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE, whole GiB")
    engine.add_argument("--layers", type=int, default=4)
    engine.add_argument("--kv-heads", type=int, default=8)
    engine.add_argument("--head-dim", type=int, default=128)
    engine.add_argument(
        "--mean-output",
        type=float,
        default=200.0,
        help="tokens: the model's answers end with P(EOS) = 1/this per step",
    )
    engine.add_argument(
        "--quota-units",
        type=int,
        default=0,
        help="each tenant's quota, 256 MiB units (0: the engine's whole KV)",
    )
    where = parser.add_argument_group("where")
    where.add_argument(
        "--redis-url",
        default=DEFAULT_REDIS_URL,
        help="the platforms' Redis database, flushed at each start",
    )
    where.add_argument("--no-ceiling", action="store_true", help="skip the client's ceiling")
    where.add_argument("--stand-in-port", type=int, default=8199)
    where.add_argument("--result-dir", type=Path, help="default var/bench/reservation-DATE")
    args = parser.parse_args()
    if args.redis_url.rstrip("/").endswith("/0"):
        parser.error("--redis-url: not database 0 (make run's); it is flushed")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    args.result_dir = (args.result_dir or REPO / "var" / "bench" / f"reservation-{stamp}").resolve()
    return args


def estimate_s(args: argparse.Namespace) -> float:
    cell = args.warmup + args.duration + CELL_OVERHEAD_S
    per_mode = len(args.kinds) * len(args.concurrencies)
    alone = per_mode * (len(args.modes) if args.engine_alone == "each" else 1)
    total = len(args.modes) * PLATFORM_S + (len(args.modes) * per_mode + alone) * cell
    total += 0 if args.no_ceiling else 12
    total += args.length_requests * args.mean_output / 1000 + 30 if args.length_requests else 0
    return total


def main() -> None:
    # Stop cleanly (the platform and its engine stopped) on Ctrl-C or SIGTERM, also when
    # started in the background, where a shell leaves SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    args = parse_args()
    args.result_dir.mkdir(parents=True, exist_ok=True)
    print_header()
    say(f"results and logs: {args.result_dir}")
    say(
        f"modes {', '.join(args.modes)}; kinds {', '.join(args.kinds)} (max_tokens "
        f"{args.max_tokens}); concurrencies {', '.join(map(str, args.concurrencies))} over "
        f"{len(TENANTS)} tenants; {args.duration:g} s measured after {args.warmup:g} s per "
        f"cell; engine alone: {args.engine_alone} mode; Redis {args.redis_url}"
    )
    say(f"estimated duration: about {estimate_s(args) / 60:.0f} min")
    python = vllm_python()
    model = build_model(args, python)
    say(
        f"model {model}: {args.layers} layers x {args.kv_heads} KV heads x head_dim "
        f"{args.head_dim} (bf16), P(EOS) = 1/{args.mean_output:g} per step; engine "
        f"max_model_len {args.max_model_len}, {args.max_num_seqs} seats, {args.kv_gib} GiB KV"
    )
    results: dict[str, Any] = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "started": datetime.now().astimezone().isoformat(timespec="seconds"),
        "engines": {},
        "cells": {},
    }
    path = args.result_dir / "results.json"

    def save() -> None:
        path.write_text(json.dumps(results, indent=1, default=str))

    with ExitStack() as stack:
        stack.callback(save)
        if not args.no_ceiling:
            results["ceiling"] = measure_ceiling(args)
        for mode in args.modes:
            measure_mode(args, mode, model, results, save)
        print_summary(args, results)
    say(f"\nresults: {path}\ndone in {(time.monotonic() - BEGAN) / 60:.1f} min")


if __name__ == "__main__":
    main()
