"""The platform as users run it, measured with vLLM's own benchmark client.

Starts the platform exactly as `make run` does (`bash scripts/run.sh`: SQLite under var/, the
web on 127.0.0.1:8000, the demo engine "demo" on port 8100 with 16 seats, 8 worker threads),
waits until it serves, and stops it at the end (SIGINT to run.sh's process group, which drains
and stops the engine). With --platform-url, --engine-url and --api-key it measures a platform
that is already running and starts nothing.

The load is `vllm bench serve` (vllm.benchmarks.serve, from the vLLM environment that `make run`
builds), called in-process by bench/serve_bench_client.py: random dataset, 32 prompt and 64
output tokens, ignore_eos, request rate inf, --max-concurrency C, max(60, 4*C) prompts (or
--prompts). For each concurrency (--concurrencies) and each kind of request:

- completions: /v1/completions, vLLM's "openai" backend (which always streams);
- chat: /v1/chat/completions not streamed (a backend the client adds, "openai-chat-whole":
  vLLM's own chat backend only streams; TTFT is then the whole answer's latency);
- chat-stream: /v1/chat/completions streamed, vLLM's "openai-chat" backend;

the same load (same seed, same prompts) runs straight to the engine and then through the
platform, back to back. The table gives throughput direct and through the platform and their
ratio, the TTFT and end-to-end latency the platform adds (p50 and p99, platform minus direct),
and the platform's CPU per request: CPU seconds of the web (uvicorn), the Celery worker, beat,
the engine agent and redis-server (from /proc) over the measured requests, divided by the
requests completed.
Its idle part (periodic work) is printed below the table, measured while the direct runs went
on. The last column is the client's own ceiling: the same client and settings against
bench/stand_in/instant.py, a server that answers at once, run before the platform starts: if
it is far above the other figures, the client was not the bottleneck.

--fairness: 4 tenants weighted 1:2:3:4, each keeping 16 requests open (closed loops, class
standard, 32 tokens, not streamed) for a fixed time after a warm-up; each tenant's share of
the completion tokens finished in the window against its fair share, Jain's index over tokens
per weight, and a sample of `manage.py scheduler status` taken halfway (where requests wait).

--isolation: an interactive tenant's TTFT p99 (2 closed-loop streams, streamed chat, 32
tokens) alone, then while another tenant floods the engine (48 closed loops of standard
requests, not streamed) and has an offline batch (Files and Batches API, 64-token lines)
queued; the ratio flood/alone. The same two runs go straight to the engine first (no batch
there), each request at the vLLM priority the platform gives its class: the engine's own
floor, since vLLM never preempts a running request for a waiting one. Both use tenants
bench-w1..4, bench-chat and bench-bulk, created in the platform's database the first time
and given a new key each run (through manage.py, so --platform-url must be this checkout's
platform for these two).

    .venv/bin/python bench/serve_bench.py                       # the whole sweep
    .venv/bin/python bench/serve_bench.py --concurrencies 1,8 --prompts 40 --fairness --isolation

Everything runs on this machine: on 2 cores the client, the platform, Redis and the engine
share the CPU, so figures are pessimistic; rerun on a quiet machine before quoting them. The
platform is measured as `make run` configures it (uvicorn's access log on, for one). The
whole default sweep takes roughly 5 to 10 minutes on 2 cores. The results of `vllm bench
serve` (--save-result --save-detailed), the client's log and the platform's log are kept
under var/bench/ (printed at the top).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import redis
from common import (
    REPO,
    batch_cancel,
    batch_completed,
    batch_get,
    batch_jsonl,
    batch_submit,
    cpu_seconds,
    hears_ctrl_c,
    jain_index,
    percentile,
    wait_for,
)

from protocol.classes import ENGINE_PRIORITY  # common put the repository on the path

PLATFORM_URL = "http://127.0.0.1:8000"
ENGINE_URL = "http://127.0.0.1:8100"
ENGINE = "demo"
MODEL = "demo"
CREDENTIALS = REPO / "var" / "demo-credentials.json"
TOKENIZER = REPO / "var" / "models" / "tiny-llama"
VENV_PYTHON = REPO / ".venv" / "bin" / "python"
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")  # scripts/lib.sh's default
PLATFORM_PROCESSES = ("web", "worker", "beat", "agent", "redis")
INPUT_TOKENS, OUTPUT_TOKENS = 32, 64
LOOP_PROMPT = "Tell me a story about a lighthouse keeper and a storm."


@dataclass(frozen=True)
class Kind:
    name: str
    backend: str
    endpoint: str


KINDS = (
    Kind("completions", "openai", "/v1/completions"),
    Kind("chat", "openai-chat-whole", "/v1/chat/completions"),
    Kind("chat-stream", "openai-chat", "/v1/chat/completions"),
)


# --- where and what ------------------------------------------------------------------------


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout.strip()


def print_header() -> None:
    """Date, commit, whether the tree is dirty, and the command line, for a README row."""
    changed = [line for line in git("status", "--porcelain").splitlines() if line.strip()]
    dirty = f"dirty ({len(changed)} paths changed)" if changed else "clean"
    print(f"date:    {datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"commit:  {git('rev-parse', '--short', 'HEAD')}, tree {dirty}")
    argv = list(sys.orig_argv)
    secrets = {"--api-key": "gs-...", "--engine-key": "..."}  # not for a README
    for i, arg in enumerate(argv[:-1]):
        if arg in secrets:
            argv[i + 1] = secrets[arg]
    print(f"command: {shlex.join(argv)}")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}", flush=True)


def vllm_python() -> str:
    """The vLLM environment's interpreter: GPUSHARE_VLLM_PYTHON, else what `make run` uses
    (the last line of scripts/engine_setup.sh, which builds it the first time)."""
    if os.environ.get("GPUSHARE_VLLM_PYTHON"):
        return os.environ["GPUSHARE_VLLM_PYTHON"]
    setup = subprocess.run(
        ["bash", "scripts/engine_setup.sh"], cwd=REPO, capture_output=True, text=True, check=True
    )
    return setup.stdout.strip().splitlines()[-1]


def manage(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`manage.py ARGS` in this checkout; with `check`, a failure raises with its message."""
    done = subprocess.run(
        [str(VENV_PYTHON), "manage.py", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"manage.py {shlex.join(args)} failed: {done.stderr.strip()[-500:]}")
    return done


# --- the platform: started as `make run` does, or already running ---------------------------


@dataclass
class Target:
    platform_url: str
    engine_url: str
    api_key: str
    engine_key: str  # what the engine accepts (scheduler.engines.auth): for the direct runs
    model: str
    root_pid: int | None  # run.sh (or what started the web): its platform's processes are under it

    def pids(self) -> dict[str, int]:
        return platform_pids(self.root_pid)


def port_in_use(url: str) -> bool:
    try:
        httpx.get(url, timeout=2)
    except httpx.TransportError:
        return False
    return True


def wait_for_free_ports(urls: Sequence[str], wait_s: float) -> None:
    """`make run`'s ports may belong to a platform someone else started: wait, never kill."""
    deadline = time.monotonic() + wait_s
    while busy := [url for url in urls if port_in_use(url)]:
        if time.monotonic() > deadline:
            raise SystemExit(f"still in use after {wait_s:.0f} s: {', '.join(busy)}")
        print(f"  {', '.join(busy)} in use (another platform?); waiting...", flush=True)
        time.sleep(15)


@contextmanager
def started_platform(log_path: Path, timeout_s: float, wait_s: float) -> Iterator[Target]:
    wait_for_free_ports([PLATFORM_URL, ENGINE_URL], wait_s)
    print(f"starting the platform: bash scripts/run.sh (log: {log_path})", flush=True)
    started = time.time()
    with log_path.open("wb") as log:
        run = subprocess.Popen(
            ["bash", "scripts/run.sh"],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, to signal as Ctrl-C would
            preexec_fn=hears_ctrl_c,
        )
    try:
        key = wait_until_serving(run, started, log_path, timeout_s)
        print(f"the platform serves (after {time.time() - started:.0f} s)", flush=True)
        engine_key = manage("engine", "key", ENGINE).stdout.strip()
        yield Target(PLATFORM_URL, ENGINE_URL, key, engine_key, MODEL, run.pid)
    finally:
        stop_platform(run)


def wait_until_serving(
    run: subprocess.Popen[bytes], started: float, log_path: Path, timeout_s: float
) -> str:
    """Waits for run.sh's credentials file (written this run), /readyz and /v1/models with the
    demo key listing the model; returns the key."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if run.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise SystemExit(f"scripts/run.sh exited ({run.returncode}):\n{tail}")
        with suppress(OSError, ValueError, KeyError, httpx.HTTPError):
            if CREDENTIALS.stat().st_mtime >= started - 1:
                key: str = json.loads(CREDENTIALS.read_text())["demo_api_key"]
                if httpx.get(f"{PLATFORM_URL}/readyz", timeout=5).status_code == 200:
                    models = httpx.get(
                        f"{PLATFORM_URL}/v1/models",
                        headers={"Authorization": f"Bearer {key}"},
                        timeout=5,
                    ).json()
                    if MODEL in [m["id"] for m in models["data"]]:
                        return key
        time.sleep(2)
    raise SystemExit(f"the platform did not serve within {timeout_s:.0f} s (log: {log_path})")


def stop_platform(run: subprocess.Popen[bytes]) -> None:
    """SIGINT to run.sh's process group (its trap drains and stops the engine, then the rest);
    then makes sure nothing of it is left, the engine (in a session of its own) included."""
    print("stopping the platform (the engine drains first)...", flush=True)
    with suppress(ProcessLookupError):
        os.killpg(run.pid, signal.SIGINT)
    try:
        run.wait(timeout=180)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGTERM)
        run.wait(timeout=60)
    with suppress(ProcessLookupError):  # anything of its group that outlived it
        os.killpg(run.pid, signal.SIGTERM)
    if port_in_use(ENGINE_URL):
        manage("engine", "stop", ENGINE, check=False)
    print("the platform is stopped", flush=True)


def platform_pids(root: int | None) -> dict[str, int]:
    """The web, Celery worker, beat and engine agent processes under `root` (run.sh, or whatever
    started the web), and the Redis server. Anything else running the platform's commands on this
    machine (another checkout's tests, say) is not under `root` and is left out."""
    parents: dict[int, int] = {}
    commands: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError):
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                parents[int(entry.name)] = int(stat[1])
                commands[int(entry.name)] = (entry / "cmdline").read_bytes().decode().split("\0")

    def under_root(pid: int) -> bool:
        while pid > 1:
            if pid == root:
                return True
            pid = parents.get(pid, 1)
        return False

    found: dict[str, int] = {}
    for pid, argv in sorted(commands.items()):
        name = process_name(argv)
        if root is not None and name and name not in found and under_root(pid):
            found[name] = pid
    with suppress(redis.RedisError, KeyError, ValueError):
        redis_pid = int(redis.Redis.from_url(REDIS_URL).info("server")["process_id"])
        if Path(f"/proc/{redis_pid}").exists():
            found["redis"] = redis_pid
    return found


def process_name(argv: list[str]) -> str | None:
    if "plumbing.serve" in argv:
        return "web"
    if argv[1:3] == ["-m", "agent"]:
        return "agent"
    if "celery" in [Path(a).name for a in argv[:3]]:  # .venv/bin/celery or python -m celery
        if "worker" in argv:
            return "worker"
        if "beat" in argv:
            return "beat"
    return None


def web_parent(url: str) -> int | None:
    """The parent of the process listening on `url`'s port on this machine (for a platform
    started by `make run`: run.sh, whose children are the web, worker and beat)."""
    port = httpx.URL(url).port or 80
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not inodes:
            continue
        with suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in (entry / "fd").iterdir()):
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                return int(stat[1]) if int(stat[1]) > 1 else int(entry.name)
    return None


def cpu_sample(pids: dict[str, int]) -> dict[str, float]:
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


# --- the load client (vLLM's interpreter) and the instant stand-in ---------------------------


class LoadClient:
    """bench/serve_bench_client.py in the vLLM environment: jobs in, events out (JSON lines)."""

    def __init__(self, python: str, log_path: Path, request_timeout_s: float) -> None:
        self.log_path, self.request_timeout_s = log_path, request_timeout_s
        env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [python, str(REPO / "bench" / "serve_bench_client.py"), "--log", str(log_path)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self.buffer = b""
        self.vllm_version = self.expect("ready", timeout_s=300)["vllm"]

    def send(self, job: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(job).encode() + b"\n")
        self.process.stdin.flush()

    def expect(self, event: str, timeout_s: float = 1800) -> dict[str, Any]:
        """The next event, which must be `event` (an `error` from the client raises)."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise RuntimeError(f"no '{event}' from the load client in {timeout_s:.0f} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the load client exited; see {self.log_path}")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        if message["event"] != event:
            raise RuntimeError(f"the load client: expected {event}, got {message}")
        return message

    def close(self) -> None:
        """Ends the client: at once when idle, killed when stuck in a job."""
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextmanager
def instant_server(port: int) -> Iterator[str]:
    """bench/stand_in/instant.py on `port`: an OpenAI-compatible server answering at once."""
    script = REPO / "bench" / "stand_in" / "instant.py"
    server = subprocess.Popen([sys.executable, str(script), "--port", str(port), "--model", MODEL])
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_for(lambda: port_in_use(url), timeout=30, every=0.2):
            raise SystemExit("bench/stand_in/instant.py did not start")
        yield url
    finally:
        server.terminate()
        server.wait()


# --- one `vllm bench serve` run ------------------------------------------------------------


@dataclass
class Run:
    """One `vllm bench serve` run: its result file, and the platform's CPU seconds per
    process over its measured requests (None where not measured)."""

    result: dict[str, Any]
    wall_s: float
    cpu: dict[str, float] | None

    def get(self, key: str) -> float:
        return float(self.result.get(key) or 0.0)

    @property
    def cpu_ms_per_request(self) -> float:
        if not self.cpu or not self.result.get("completed"):
            return float("nan")
        return sum(self.cpu.values()) * 1000 / self.get("completed")

    def first_errors(self, limit: int = 2) -> list[str]:
        """The distinct errors of failed requests (the last line of each), first ones first."""
        seen: list[str] = []
        for error in self.result.get("errors") or []:
            last = error.strip().splitlines()[-1][:200] if error and error.strip() else ""
            if last and last not in seen:
                seen.append(last)
        return seen[:limit]


def vllm_argv(
    kind: Kind, base_url: str, concurrency: int, prompts: int, seed: int, result: Path
) -> list[str]:
    """`vllm bench serve`'s command line for one run (what follows `vllm bench serve`)."""
    return [
        "--backend", kind.backend, "--base-url", base_url, "--endpoint", kind.endpoint,
        "--model", MODEL, "--tokenizer", str(TOKENIZER),
        "--dataset-name", "random", "--random-input-len", str(INPUT_TOKENS),
        "--random-output-len", str(OUTPUT_TOKENS), "--ignore-eos", "--seed", str(seed),
        "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
        "--request-rate", "inf", "--num-warmups", str(min(concurrency, 16)),
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
        "--disable-tqdm", "--save-result", "--save-detailed",
        "--result-dir", str(result.parent), "--result-filename", result.name,
    ]  # fmt: skip


def bench_run(
    client: LoadClient, argv: list[str], api_key: str | None, pids: dict[str, int] | None
) -> Run:
    """Runs `vllm bench serve` once; samples `pids`' CPU at its begin and end markers."""
    job = {"job": "vllm", "argv": argv, "api_key": api_key}
    client.send({**job, "request_timeout_s": client.request_timeout_s})
    client.expect("begin")
    started, before = time.monotonic(), cpu_sample(pids or {})
    client.expect("end")
    wall, after = time.monotonic() - started, cpu_sample(pids or {})
    client.expect("done")
    folder, filename = (argv[argv.index(o) + 1] for o in ("--result-dir", "--result-filename"))
    result = json.loads(Path(folder, filename).read_text())
    cpu = {name: after[name] - before[name] for name in after} if pids else None
    return Run(result, wall, cpu)


def describe(label: str, run: Run) -> str:
    return (
        f"  {label:<34} {run.get('request_throughput'):8.2f} req/s  TTFT p50 "
        f"{run.get('median_ttft_ms'):7.1f} p99 {run.get('p99_ttft_ms'):7.1f} ms  E2E p50 "
        f"{run.get('median_e2el_ms'):7.1f} p99 {run.get('p99_e2el_ms'):7.1f} ms  "
        f"failed {run.get('failed'):.0f}"
        + "".join(f"\n      error: {e}" for e in run.first_errors())
    )


# --- the sweep -------------------------------------------------------------------------------


@dataclass
class Row:
    kind: Kind
    concurrency: int
    prompts: int
    ceiling: Run | None = None
    direct: Run | None = None
    platform: Run | None = None


def prompts_for(concurrency: int, fixed: int | None) -> int:
    return fixed if fixed else max(60, 4 * concurrency)


def measure_ceilings(client: LoadClient, rows: list[Row], args: argparse.Namespace) -> None:
    print("\nclient ceiling: the same load against bench/stand_in/instant.py", flush=True)
    with instant_server(args.stand_in_port) as url:
        for row in rows:
            result = args.result_dir / f"{row.kind.name}-c{row.concurrency}-ceiling.json"
            argv = vllm_argv(row.kind, url, row.concurrency, row.prompts, args.seed, result)
            row.ceiling = bench_run(client, argv, None, None)
            print(describe(f"{row.kind.name} c={row.concurrency} stand-in", row.ceiling))


def measure_sweep(
    client: LoadClient, target: Target, rows: list[Row], args: argparse.Namespace
) -> None:
    """Each row: the engine directly, then the platform, back to back."""
    print(f"\nthe sweep: engine {target.engine_url} vs platform {target.platform_url}")
    pids = target.pids()
    missing = [name for name in PLATFORM_PROCESSES if name not in pids]
    print(f"platform processes for CPU: {pids}" + (f" (not found: {missing})" if missing else ""))
    for row in rows:
        name = f"{row.kind.name}-c{row.concurrency}"
        load = (row.concurrency, row.prompts, args.seed)
        direct = vllm_argv(
            row.kind, target.engine_url, *load, args.result_dir / f"{name}-direct.json"
        )
        row.direct = bench_run(client, direct, target.engine_key, pids)
        print(describe(f"{row.kind.name} c={row.concurrency} direct", row.direct), flush=True)
        through = vllm_argv(
            row.kind, target.platform_url, *load, args.result_dir / f"{name}-platform.json"
        )
        row.platform = bench_run(client, through, target.api_key, pids)
        print(describe(f"{row.kind.name} c={row.concurrency} platform", row.platform), flush=True)


def fmt(value: float, width: int, digits: int = 1) -> str:
    return f"{'-':>{width}}" if value != value else f"{value:{width}.{digits}f}"  # NaN: none


def print_sweep(rows: list[Row]) -> None:
    print(
        f"\n{'kind':<12}{'conc':>5}{'reqs':>6} |{'direct':>8}{'platform':>9}{'ratio':>7} |"
        f"{'+TTFT p50':>10}{'p99':>7} |{'+E2E p50':>9}{'p99':>7} |{'CPU/req':>8} |"
        f"{'failed':>7} |{'ceiling':>8}\n{'':<23} |{'req/s':>8}{'req/s':>9}{'p/d':>7} |"
        f"{'ms':>10}{'ms':>7} |{'ms':>9}{'ms':>7} |{'ms':>8} |{'d/p':>7} |{'req/s':>8}"
    )
    for row in rows:
        d, p, c = row.direct, row.platform, row.ceiling
        if d is None or p is None:
            continue
        ratio = p.get("request_throughput") / (d.get("request_throughput") or float("nan"))
        failed = f"{d.get('failed'):.0f}/{p.get('failed'):.0f}"
        print(
            f"{row.kind.name:<12}{row.concurrency:>5}{row.prompts:>6} |"
            f"{fmt(d.get('request_throughput'), 8, 2)}{fmt(p.get('request_throughput'), 9, 2)}"
            f"{fmt(ratio, 7, 2)} |"
            f"{fmt(p.get('median_ttft_ms') - d.get('median_ttft_ms'), 10)}"
            f"{fmt(p.get('p99_ttft_ms') - d.get('p99_ttft_ms'), 7)} |"
            f"{fmt(p.get('median_e2el_ms') - d.get('median_e2el_ms'), 9)}"
            f"{fmt(p.get('p99_e2el_ms') - d.get('p99_e2el_ms'), 7)} |"
            f"{fmt(p.cpu_ms_per_request, 8, 2)} |{failed:>7} |"
            f"{fmt(c.get('request_throughput') if c else float('nan'), 8, 0)}"
        )
    print_cpu_notes(rows)


def print_cpu_notes(rows: list[Row]) -> None:
    """The platform's CPU by process over all platform runs, and its idle rate (measured while
    the direct runs went on: the platform then only does its periodic work)."""
    busy: dict[str, float] = {}
    idle: dict[str, float] = {}
    requests, idle_s = 0.0, 0.0
    for row in rows:
        if row.platform and row.platform.cpu:
            requests += row.platform.get("completed")
            for name, seconds in row.platform.cpu.items():
                busy[name] = busy.get(name, 0.0) + seconds
        if row.direct and row.direct.cpu:
            idle_s += row.direct.wall_s
            for name, seconds in row.direct.cpu.items():
                idle[name] = idle.get(name, 0.0) + seconds
    if not busy or not requests:
        print("platform CPU: not measured (its processes were not found on this machine)")
        return
    per_request = ", ".join(f"{n} {s * 1000 / requests:.2f}" for n, s in busy.items())
    print(f"\nplatform CPU per request over all platform runs, ms: {per_request}")
    if idle_s:
        rates = ", ".join(f"{n} {s * 1000 / idle_s:.1f}" for n, s in idle.items())
        total = sum(idle.values()) * 1000 / idle_s
        print(
            f"the same processes idle (during the direct runs, {idle_s:.0f} s): {total:.1f} ms "
            f"of CPU per second ({rates}); each row's CPU/req includes that rate divided by "
            "its platform req/s"
        )
    print(
        "redis-server is this machine's: other users of it (tests, other benchmarks) count too.\n"
        "ratio p/d: platform/direct throughput; +TTFT, +E2E: platform minus direct; completions\n"
        "and chat-stream are streamed, chat is not (its TTFT is the whole answer); ceiling: the\n"
        "same client and settings against a server that answers at once"
    )


# --- tenants for fairness and isolation ------------------------------------------------------


def bench_tenant(slug: str, weight: float, classes: Sequence[str], quota_units: int = 8) -> str:
    """Creates the tenant, or sets an existing one (an earlier run's) to these settings;
    returns a new API key of it."""
    policy = ["--weight", str(weight), "--quota-units", str(quota_units), "--classes", *classes]
    if manage("tenant", "show", slug, "--json", check=False).returncode == 0:
        manage("tenant", "update", slug, *policy, "--activate")
        key_options = ["--name", "serve-bench", "--class", classes[0], "--json"]
        key: str = json.loads(manage("key", "create", slug, *key_options).stdout)["key"]
        return key
    created = json.loads(manage("tenant", "create", slug, *policy, "--json").stdout)
    key = created["api_key"]["key"]
    return key


def loop_group(
    tag: str,
    key: str,
    request_class: str,
    streams: int,
    stream: bool,
    max_tokens: int,
    spread: float = 0.0,
) -> dict[str, Any]:
    """One tenant's closed loops in a loops job (see bench/serve_bench_client.py); with
    `spread`, each request's max_tokens is drawn from max_tokens * (1 -+ spread)."""
    group: dict[str, Any] = {
        "tag": tag,
        "key": key,
        "request_class": request_class,
        "streams": streams,
        "stream": stream,
        "max_tokens": max_tokens,
    }
    if spread > 0:
        group["max_tokens_spread"] = spread
    return group


def straight_to_the_engine(group: dict[str, Any], target: Target) -> dict[str, Any]:
    """The group's loops sent to the engine itself (with its key), each request at the
    priority the platform would give its class."""
    priority = ENGINE_PRIORITY[group["request_class"]]
    return {**group, "key": target.engine_key, "priority": priority}


def loops_job(
    target: Target,
    groups: list[dict[str, Any]],
    warmup_s: float,
    duration_s: float,
    direct: bool = False,
) -> dict[str, Any]:
    base = target.engine_url if direct else target.platform_url
    return {
        "job": "loops",
        "url": f"{base}/v1/chat/completions",
        "model": target.model,
        "prompt": LOOP_PROMPT,
        "warmup_s": warmup_s,
        "duration_s": duration_s,
        "groups": groups,
    }


def run_loops(
    client: LoadClient, job: dict[str, Any], during: Callable[[], None] | None = None
) -> tuple[list[dict[str, Any]], tuple[float, float]]:
    """Runs closed loops; `during` runs once the measured window has opened. Returns the
    requests that finished inside the window, and the window."""
    client.send({**job, "request_timeout_s": client.request_timeout_s})
    client.expect("begin", timeout_s=job["warmup_s"] + 600)
    if during:
        during()
    answer = client.expect("done", timeout_s=job["duration_s"] + 900)["result"]
    start, end = answer["window"]
    inside = [r for r in answer["records"] if start <= r["finished"] <= end]
    return inside, (start, end)


def error_lines(records: list[dict[str, Any]], limit: int = 3) -> list[str]:
    seen: list[str] = []
    for record in records:
        text = f"{record['status']} {record['error']}"[:200]
        if not record["ok"] and text not in seen:
            seen.append(text)
    return seen[:limit]


# --- fairness ----------------------------------------------------------------------------------


def measure_fairness(client: LoadClient, target: Target, args: argparse.Namespace) -> None:
    weights = {f"bench-w{w}": float(w) for w in (1, 2, 3, 4)}
    print(
        f"\nfairness: 4 tenants {':'.join(f'{w:g}' for w in weights.values())}, "
        f"{args.outstanding} open requests each (closed loops, standard, {args.loop_tokens} "
        f"tokens, not streamed); {args.fairness_duration:g} s after {args.fairness_warmup:g} s",
        flush=True,
    )
    keys = {slug: bench_tenant(slug, weight, ["standard"]) for slug, weight in weights.items()}
    groups = [
        loop_group(slug, key, "standard", args.outstanding, False, args.loop_tokens)
        for slug, key in keys.items()
    ]
    status: list[str] = []

    def sample_status() -> None:
        time.sleep(args.fairness_duration / 2)
        status.append(manage("scheduler", "status", check=False).stdout)

    job = loops_job(target, groups, args.fairness_warmup, args.fairness_duration)
    records, (start, end) = run_loops(client, job, sample_status)
    print_fairness(records, weights, end - start)
    print("\n`manage.py scheduler status` halfway through:")
    for line in status[0].splitlines()[:30]:
        print(f"  {line}")


def print_fairness(records: list[dict[str, Any]], weights: dict[str, float], window: float) -> None:
    total_weight = sum(weights.values())
    tokens = {
        slug: sum(r["completion_tokens"] for r in records if r["ok"] and r["tag"] == slug)
        for slug in weights
    }
    served = sum(tokens.values()) or 1
    print(
        f"\n{'tenant':<10}{'weight':>7}{'tokens':>8}{'share':>7}{'fair':>7}{'x fair':>7}"
        f"{'reqs':>6}{'p99 ms':>8}{'errors':>7}"
    )
    for slug, weight in weights.items():
        mine = [r for r in records if r["tag"] == slug]
        ok = [r for r in mine if r["ok"]]
        share, fair = tokens[slug] / served, weight / total_weight
        p99 = percentile([r["latency"] for r in ok], 0.99) * 1000
        print(
            f"{slug:<10}{weight:7.0f}{tokens[slug]:8d}{share:7.3f}{fair:7.3f}{share / fair:7.2f}"
            f"{len(ok):6d}{fmt(p99, 8, 0)}{len(mine) - len(ok):7d}"
        )
    jain = jain_index([tokens[slug] / weight for slug, weight in weights.items()])
    print(
        f"completion tokens served {served / window:.0f}/s over {window:.0f} s; Jain's index over "
        f"tokens/weight {jain:.3f} (1.000 = exactly weighted)"
    )
    for line in error_lines(records):
        print(f"  error: {line}")


# --- isolation -----------------------------------------------------------------------------


def measure_isolation(client: LoadClient, target: Target, args: argparse.Namespace) -> None:
    print(
        f"\nisolation: interactive TTFT, 2 closed loops of streamed chat ({args.loop_tokens} "
        f"tokens), alone vs beside {args.flood_streams} loops of another tenant's standard "
        f"requests and an offline batch of {args.batch_lines} lines; {args.isolation_duration:g} s"
        " each",
        flush=True,
    )
    chat_key = bench_tenant("bench-chat", 1.0, ["interactive"])
    bulk_key = bench_tenant("bench-bulk", 1.0, ["standard", "offline"])
    warmup = args.isolation_warmup
    interactive = loop_group("interactive", chat_key, "interactive", 2, True, args.loop_tokens)
    flood = loop_group("flood", bulk_key, "standard", args.flood_streams, False, args.loop_tokens)
    # The engine's own floor first: the same loops straight to it, at the classes' priorities.
    straight = [straight_to_the_engine(g, target) for g in (interactive, flood)]
    engine_runs = [
        run_loops(client, loops_job(target, groups, warmup, args.isolation_duration, True))
        for groups in (straight[:1], straight)
    ]
    alone, _ = run_loops(client, loops_job(target, [interactive], warmup, args.isolation_duration))
    line = {
        "model": target.model,
        "messages": [{"role": "user", "content": LOOP_PROMPT}],
        "max_tokens": 2 * args.loop_tokens,
        "ignore_eos": True,
    }
    batch_id = batch_submit(target.platform_url, bulk_key, batch_jsonl([line] * args.batch_lines))
    progress: list[int] = []

    def batch_progress() -> None:
        progress.append(batch_completed(batch_get(target.platform_url, bulk_key, batch_id)))

    try:
        job = loops_job(target, [interactive, flood], warmup, args.isolation_duration)
        flooded, (start, end) = run_loops(client, job, batch_progress)
        batch_progress()
    finally:
        batch_cancel(target.platform_url, bulk_key, batch_id)
    print_isolation(alone, flooded, end - start, progress, [r for r, _ in engine_runs])


def print_isolation(
    alone: list[dict[str, Any]],
    flooded: list[dict[str, Any]],
    window: float,
    batch: list[int],
    engine_runs: list[list[dict[str, Any]]],
) -> None:
    print(
        f"\n{'interactive requests':<36}{'reqs':>6}{'TTFT p50':>10}{'p99':>8}{'E2E p50':>9}"
        f"{'p99':>8}{'errors':>7}  (ms)"
    )
    p99s = []
    rows = (
        ("engine alone", engine_runs[0]),
        ("engine beside the flood", engine_runs[1]),
        ("platform alone", alone),
        ("platform beside the flood + batch", flooded),
    )
    for name, records in rows:
        mine = [r for r in records if r["tag"] == "interactive"]
        ok = [r for r in mine if r["ok"]]
        ttft = [r["ttft"] * 1000 for r in ok if r["ttft"] is not None]
        e2e = [r["latency"] * 1000 for r in ok]
        p99s.append(percentile(ttft, 0.99))
        print(
            f"{name:<36}{len(ok):6d}{fmt(percentile(ttft, 0.5), 10, 0)}"
            f"{fmt(percentile(ttft, 0.99), 8, 0)}{fmt(percentile(e2e, 0.5), 9, 0)}"
            f"{fmt(percentile(e2e, 0.99), 8, 0)}{len(mine) - len(ok):7d}"
        )
        for line in error_lines(mine):
            print(f"  error: {line}")
    flood_ok = [r for r in flooded if r["tag"] == "flood" and r["ok"]]
    tokens = sum(r["completion_tokens"] for r in flood_ok)
    lines = f"{batch[-1] - batch[0]} batch lines completed" if len(batch) == 2 else "batch: ?"
    print(
        f"meanwhile the flood: {len(flood_ok)} requests, {tokens / window:.0f} tokens/s; {lines} "
        f"(offline work runs only while the engine's load is under its threshold)"
    )
    for line in error_lines([r for r in flooded if r["tag"] == "flood"]):
        print(f"  flood error: {line}")
    print(
        f"interactive TTFT p99 beside the flood / alone: engine {p99s[1] / p99s[0]:.2f}x "
        f"(vLLM's priority scheduling, nothing in front), platform {p99s[3] / p99s[2]:.2f}x"
    )


# --- main ------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrencies", default="1,8,32,64,128", help="e.g. 1,8,32")
    parser.add_argument("--prompts", type=int, help="prompts per run (default max(60, 4*C))")
    parser.add_argument("--kinds", default=",".join(k.name for k in KINDS), help="which kinds")
    parser.add_argument("--seed", type=int, default=0, help="the random dataset's seed")
    parser.add_argument("--fairness", action="store_true", help="also the fairness run")
    parser.add_argument("--isolation", action="store_true", help="also the isolation run")
    parser.add_argument("--no-sweep", action="store_true", help="skip the sweep (and ceiling)")
    parser.add_argument("--outstanding", type=int, default=16, help="fairness: per tenant")
    parser.add_argument("--fairness-duration", type=float, default=30.0)
    parser.add_argument("--fairness-warmup", type=float, default=5.0)
    parser.add_argument("--loop-tokens", type=int, default=32, help="fairness and isolation")
    parser.add_argument("--flood-streams", type=int, default=48)
    parser.add_argument("--batch-lines", type=int, default=200)
    parser.add_argument("--isolation-duration", type=float, default=20.0)
    parser.add_argument("--isolation-warmup", type=float, default=5.0)
    parser.add_argument("--platform-url", help="measure this running platform; start nothing")
    parser.add_argument("--engine-url", help="with --platform-url: its engine, for direct runs")
    parser.add_argument("--api-key", help="with --platform-url: a tenant key")
    parser.add_argument(
        "--engine-key", help="with --platform-url: the engine's (`manage.py engine key NAME`)"
    )
    parser.add_argument("--start-timeout", type=float, default=900.0, help="s for make run")
    parser.add_argument("--port-wait", type=float, default=1800.0, help="s to wait for :8000")
    parser.add_argument("--stand-in-port", type=int, default=8199)
    parser.add_argument(
        "--request-timeout", type=float, default=120.0, help="s; a request over it has failed"
    )
    parser.add_argument("--result-dir", type=Path, help="default var/bench/serve_bench-DATE")
    args = parser.parse_args()
    external = [args.platform_url, args.engine_url, args.api_key, args.engine_key]
    if any(external) and not all(external):
        parser.error("--platform-url, --engine-url, --api-key and --engine-key go together")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    args.result_dir = (args.result_dir or REPO / "var" / "bench" / f"serve_bench-{stamp}").resolve()
    args.result_dir.mkdir(parents=True, exist_ok=True)
    return args


def sweep_rows(args: argparse.Namespace) -> list[Row]:
    kinds = [k for name in args.kinds.split(",") for k in KINDS if k.name == name.strip()]
    concurrencies = [int(c) for c in args.concurrencies.split(",") if c.strip()]
    return [Row(k, c, prompts_for(c, args.prompts)) for c in concurrencies for k in kinds]


def exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    # Stop cleanly (the platform included) on Ctrl-C or SIGTERM, also when started in the
    # background, where a shell leaves SIGINT ignored (run.sh would inherit that and could not
    # trap it).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    args = parse_args()
    print_header()
    print(f"results and logs: {args.result_dir}")
    python = vllm_python()
    print(f"load client: vllm.benchmarks.serve with {python}", flush=True)
    rows = [] if args.no_sweep else sweep_rows(args)
    with ExitStack() as stack:
        client = LoadClient(python, args.result_dir / "client.log", args.request_timeout)
        stack.callback(client.close)
        print(f"vLLM {client.vllm_version}", flush=True)
        if rows:
            measure_ceilings(client, rows, args)
        if args.platform_url:
            root = web_parent(args.platform_url)
            target = Target(
                args.platform_url, args.engine_url, args.api_key, args.engine_key, MODEL, root
            )
        else:
            log = args.result_dir / "platform.log"
            target = stack.enter_context(started_platform(log, args.start_timeout, args.port_wait))
        if rows:
            measure_sweep(client, target, rows, args)
            print_sweep(rows)
        if args.fairness:
            measure_fairness(client, target, args)
        if args.isolation:
            measure_isolation(client, target, args)


if __name__ == "__main__":
    main()
