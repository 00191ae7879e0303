"""The fair queue alone: Redis's CPU and memory per request, replayed against a redis-server
this script starts (its own port, no persistence, nothing else on it).

Each request's life in Redis, as the platform lives it: the web admits it (its tenant's
limits script) and enqueues it with a 2 KB body (`enqueue_summoning`); when a running request
ends, its worker releases it with its last words (the `done` event to the web's inbox, its
ledger row) and picks the pool's next job in the same call (`release_and_pick`, the
dispatcher's turn); the web reads its inbox, and the tokens the request did not use go back
to its limits (`limits_settle`). The ledger's rows are drained as the flusher drains them.
The engines are simulated (a running request ends when its turn comes, at random): they
take no CPU, and every seat stays busy, with a queue of at least 2,000 behind them.

Per shape (engines in the pool x tenants):
  - Redis CPU per request: the scripts' time (INFO commandstats of EVALSHA and FCALL, the
    commands they call included) and INFO cpu (the server's user + system time: commands,
    network, event loop); with --instructions, the instructions redis-server executes
    (callgrind: the same count run after run, however busy the machine is);
  - Redis memory per request waiting, in flight, finished within the finished-job window
    (GPUSHARE_SCHED_KEEP_S), and finished once the window has passed (--keep-s here: the
    bytes a finished request holds do not depend on how long it is kept); and what stays
    per tenant, not per request (its answer-length samples in the pool, kept a day).

    .venv/bin/python bench/queue_replay.py            # the issue's shapes
    .venv/bin/python bench/queue_replay.py --engines 1,128 --tenants 100 --requests 2000

Redis Cluster is not replayed: the queue's scripts do not declare their keys
(docs/proposals/0001-fair-queue-on-redis-cluster.md).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

POOL = "bench"
GIB = 1024**3
SEATS_PER_ENGINE = 16
BODY = "x" * 2048
INBOX = "web-1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """A redis-server of the bench's own."""

    process: subprocess.Popen[bytes]
    url: str
    workdir: str
    version: str

    counting: bool = False  # under callgrind: instructions are counted when asked

    @classmethod
    def start(cls, counting: bool = False, extra: tuple[str, ...] = ()) -> Server:
        import redis

        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        port, workdir = free_port(), tempfile.mkdtemp(prefix="queue-replay-")
        command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--dir", workdir, *extra]  # fmt: skip
        if counting:
            command = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                       f"--callgrind-out-file={workdir}/callgrind.out", *command]  # fmt: skip
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url)
        for _ in range(1200):
            try:
                version = str(client.info("server")["redis_version"])
                return cls(process, url, workdir, version, counting)
            except redis.ConnectionError:
                time.sleep(0.05)
        process.kill()
        raise RuntimeError("redis-server did not start")

    def count(self, on: bool) -> None:
        """Starts or stops counting the server's instructions (callgrind)."""
        if self.counting:
            switch = "--instr=on" if on else "--instr=off"
            subprocess.run(["callgrind_control", switch, str(self.process.pid)],
                           check=True, capture_output=True)  # fmt: skip

    def instructions(self) -> int:
        """The instructions counted so far, dumped and read back."""
        subprocess.run(["callgrind_control", "--dump", str(self.process.pid)],
                       check=True, capture_output=True)  # fmt: skip
        total = 0
        for dump in Path(self.workdir).glob("callgrind.out.*"):  # the dumps made on request
            for line in dump.read_text().splitlines():
                if line.startswith("totals:"):
                    total += int(line.split()[1])
            dump.unlink()
        return total

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def command_stats(client: Any) -> dict[str, tuple[int, float]]:
    """Each command's calls and time (us) so far."""
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): (int(v["calls"]), float(v["usec"]))
            for name, v in stats.items()}  # fmt: skip


# A script's time counts the commands it calls, which INFO commandstats counts again under
# their own names: the scripts' time is read from these alone.
SCRIPT_COMMANDS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")


def script_usec(client: Any) -> float:
    """The time Redis spent in scripts and functions (EVALSHA, EVAL, FCALL) so far."""
    stats = client.info("commandstats")
    return float(sum(stats.get(f"cmdstat_{name}", {}).get("usec", 0) for name in SCRIPT_COMMANDS))


class Breakdown:
    """Each step's script time, read around it (--breakdown: slower, for finding the cost)."""

    def __init__(self, client: Any, on: bool) -> None:
        self.client, self.on = client, on
        self.usec: dict[str, float] = {}

    def step(self, name: str, work: Any) -> Any:
        if not self.on:
            return work()
        before = script_usec(self.client)
        result = work()
        self.usec[name] = self.usec.get(name, 0.0) + script_usec(self.client) - before
        return result


def server_cpu_s(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def used_memory(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def settled_memory(client: Any, keys: int) -> int:
    """used_memory once the keys that expired are gone: Redis removes them in its own time,
    so wait until the key count stops falling to `keys` or below."""
    for _ in range(200):
        if int(client.dbsize()) <= keys:
            break
        time.sleep(0.05)
    return used_memory(client)


@dataclass
class Shape:
    engines: int
    tenants: int


class Replay:
    def __init__(self, server: Server, shape: Shape) -> None:
        import redis

        from fairqueue.domain import EnginePolicy, TenantPolicy
        from scheduler.pools.policies import fair_queue
        from tenants.models import Tenant
        from tenants.usage_buffer import outbox

        self.server = server
        self.client = redis.Redis.from_url(server.url)
        self.client.flushall()
        self.queue = fair_queue()
        self.shape = shape
        self.pending_key = outbox(POOL)
        for i in range(shape.engines):
            self.queue.set_engine_policy(
                EnginePolicy(f"e{i}", POOL, 40 * GIB, SEATS_PER_ENGINE, queued=0)
            )
        self.slugs = [f"t{i}" for i in range(shape.tenants)]
        self.tenants = []
        for i, slug in enumerate(self.slugs):
            self.queue.set_tenant_policy(slug, TenantPolicy(1 + i % 4, 1000 * GIB))
            self.tenants.append(Tenant(pk=i + 1, slug=slug, rpm_limit=10**7, tpm_limit=10**10))
        self.rng = random.Random(7)
        self.inbox = self.queue.keys.inbox(POOL, INBOX)
        self.admissions: dict[str, Any] = {}
        self.breakdown = Breakdown(self.client, False)
        # The dispatcher's turn picks for the engine its job ran on (a tree from before that
        # had no choice: it looked at every engine of the pool).
        turn = inspect.signature(self.queue.release_and_pick).parameters
        self.turn: dict[str, Any] = {"same_engine": True} if "same_engine" in turn else {}
        # Each job carries its tenant's prefix-cache affinity key, as the web's do (where the
        # queue knows of affinity: a replay of an older commit runs without).
        self.affine = "affinity" in inspect.signature(self.queue.enqueue_args).parameters

    def arrive(self) -> None:
        from tenants.limits import limits_admit

        i = self.rng.randrange(self.shape.tenants)
        admission = self.breakdown.step(
            "admit", lambda: limits_admit(tenant=self.tenants[i], estimated_tokens=600)
        )
        payload = {"inbox": self.inbox, "endpoint": "chat", "stream": False,
                   "body": {"model": POOL, "messages": [{"role": "user", "content": BODY}]},
                   "tenant_id": i + 1, "model": POOL, "admission": admission.settling_fields(),
                   "received_at": time.time()}  # fmt: skip
        summary = {k: v for k, v in payload.items() if k != "body"}
        job, _ = self.breakdown.step("enqueue", lambda: self.queue.enqueue_summoning(
            tenant=self.slugs[i], pool=POOL, request_class="standard", prompt_tokens=512,
            max_tokens=88, kv_bytes=64 * 1024 * 1024, payload=json.dumps(payload),
            summary=json.dumps(summary), inbox=self.inbox,
            **({"affinity": f"tenant:{i + 1}"} if self.affine else {}),
        ))  # fmt: skip
        self.admissions[job.job_id] = admission

    def fill_one(self) -> Any:
        job = self.queue.pick(POOL)
        if job is None:
            raise RuntimeError("nothing to pick")
        return job

    def fill(self) -> list[Any]:
        running = []
        for _ in range(self.shape.engines * SEATS_PER_ENGINE):
            job = self.queue.pick(POOL)
            if job is None:
                raise RuntimeError("a seat stayed empty")
            running.append(job)
        return running

    def end(self, job: Any) -> Any:
        """The job's run ends: released with its last words and the pool's next pick; the
        web reads its answer and settles its limits."""
        from fairqueue.queue import LastWords
        from tenants.limits import limits_settle

        done = {
            "event": "done",
            "attempt": job.attempt,
            "usage": {"prompt_tokens": 500, "completion_tokens": 80, "total_tokens": 580},
            "body": {"id": "chatcmpl-1", "choices": [{"message": {"content": "y" * 320}}]},
        }
        row = json.dumps(
            {
                "job_id": job.job_id,
                "tenant": job.tenant,
                "prompt_tokens": 500,
                "completion_tokens": 80,
                "model": POOL,
                "finished_at": time.time(),
            }
        )
        words = LastWords(event=done, outbox=self.pending_key, entry=row, ttft_s=0.2)
        _, next_job = self.breakdown.step("release_pick", lambda: self.queue.release_and_pick(
            job, 500, 80, pool=POOL, last_words=words, **self.turn
        ))  # fmt: skip
        self.client.lpop(self.inbox, 16)
        admission = self.admissions.pop(job.job_id)
        self.breakdown.step("settle", lambda: limits_settle(admission=admission, used_tokens=580))
        return next_job

    def run(self, requests: int, keep_s: int, breakdown: bool) -> dict[str, Any]:
        client = self.client
        # One request's whole life first: every script is loaded (a script's text is
        # Redis memory too), and the pool's own keys exist.
        self.arrive()
        first = self.fill_one()
        self.end(first)
        client.delete(self.inbox, self.pending_key)
        empty = used_memory(client)
        seats = self.shape.engines * SEATS_PER_ENGINE
        waiting = max(seats, 2000)  # a queue behind the seats (and many to measure)
        for _ in range(seats + waiting):
            self.arrive()
        with_waiting = used_memory(client)
        running = self.fill()
        in_flight = used_memory(client)
        keys_in_flight = int(client.dbsize())
        # Waiting jobs: (seats + waiting) enqueued; then `seats` of them picked.
        per_waiting = (with_waiting - empty) / (seats + waiting)
        per_running = per_waiting + (in_flight - with_waiting) / seats
        commands, cpu = command_stats(client), server_cpu_s(client)
        started = time.perf_counter()
        self.breakdown.on = breakdown
        self.server.count(True)
        for turn in range(requests):
            if time.perf_counter() - started > keep_s:
                raise RuntimeError("the replay outlasted --keep-s: finished jobs expired in it")
            self.arrive()
            job = running.pop(self.rng.randrange(len(running)))
            next_job = self.end(job)
            if next_job is None:
                raise RuntimeError("a released seat was not refilled")
            running.append(next_job)
            if turn % 100 == 99:  # the ledger's flusher
                client.ltrim(self.pending_key, 100, -1)
        self.server.count(False)
        instructions = self.server.instructions() / requests if self.server.counting else 0.0
        self.breakdown.on = False
        spent = {
            name: ((calls - commands.get(name, (0, 0.0))[0]) / requests,
                   (usec - commands.get(name, (0, 0.0))[1]) / requests)
            for name, (calls, usec) in command_stats(client).items()
        }  # fmt: skip
        usec = sum(spent[name][1] for name in SCRIPT_COMMANDS if name in spent)
        cpu_ms = (server_cpu_s(client) - cpu) / requests * 1000
        client.delete(self.pending_key)
        finished = used_memory(client)
        per_finished = (finished - in_flight) / requests
        if self.server.counting:  # slowed down many times: the window is not waited for
            per_finished_after, sample_bytes = float("nan"), 0
        else:
            time.sleep(max(0.0, keep_s + 0.5 - (time.perf_counter() - started)))
            # What stays per tenant, not per request: its answer-length samples (a day).
            samples = [*client.scan_iter(self.queue.keys.output_lengths(POOL, "*"))]
            samples.append(self.queue.keys.output_predictions(POOL))
            sample_bytes = sum(int(client.memory_usage(key) or 0) for key in samples)
            after = settled_memory(client, keys_in_flight) - sample_bytes
            per_finished_after = max(0.0, (after - in_flight) / requests)
        return {"usec": usec, "cpu_ms": cpu_ms, "per_waiting": per_waiting,
                "per_running": per_running, "per_finished": per_finished,
                "per_finished_after": per_finished_after,
                "per_tenant": sample_bytes / self.shape.tenants, "commands": spent,
                "instructions": instructions,
                "steps": {k: v / requests for k, v in self.breakdown.usec.items()}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="1,8,32,128", help="engines per pool (list)")
    parser.add_argument("--tenants", default="4,100,1000", help="tenants (list)")
    parser.add_argument("--requests", type=int, default=2000, help="requests per shape")
    parser.add_argument(
        "--keep-s",
        type=int,
        default=20,
        help="the finished-job window here (longer than a shape's replay)",
    )
    parser.add_argument("--breakdown", action="store_true",
                        help="also each step's script time per request (its CPU column then "
                        "counts the INFO calls too)")  # fmt: skip
    parser.add_argument("--instructions", action="store_true",
                        help="run redis-server under callgrind and print the instructions it "
                        "executes per request: the same count run after run, however busy the "
                        "machine is (slow: give --keep-s several minutes)")  # fmt: skip
    parser.add_argument("--redis-args", default="",
                        help="more redis-server arguments, as one string: a configuration to "
                        "measure, e.g. '--zset-max-listpack-entries 16'")  # fmt: skip
    args = parser.parse_args()

    server = Server.start(counting=args.instructions, extra=tuple(args.redis_args.split()))
    os.environ["REDIS_URL"] = server.url
    os.environ["GPUSHARE_SCHED_KEEP_S"] = str(args.keep_s)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    shapes = [Shape(int(e), 100) for e in args.engines.split(",")]
    shapes += [Shape(8, int(t)) for t in args.tenants.split(",") if int(t) != 100]
    print(f"redis-server {server.version}, {args.requests} requests per shape, "
          f"{SEATS_PER_ENGINE} seats per engine, a 2 KB body each")  # fmt: skip
    print(
        f"{'engines':>7} {'tenants':>7} | {'script us':>10} {'cpu ms/req':>10} | "
        f"{'waiting B':>9} {'in flight B':>11} {'finished B':>10} {'after window B':>14} | "
        f"{'per tenant B':>12}"
    )
    try:
        for shape in shapes:
            result = Replay(server, shape).run(args.requests, args.keep_s, args.breakdown)
            # Under callgrind the times are callgrind's: its instructions stand in for them.
            usec, cpu = (f"{'-':>10}", f"{'-':>10}") if args.instructions else (
                f"{result['usec']:>10.0f}", f"{result['cpu_ms']:>10.3f}")  # fmt: skip
            print(f"{shape.engines:>7} {shape.tenants:>7} | {usec} "
                  f"{cpu} | {result['per_waiting']:>9.0f} "
                  f"{result['per_running']:>11.0f} {result['per_finished']:>10.0f} "
                  f"{result['per_finished_after']:>14.0f} | {result['per_tenant']:>12.0f}",
                  flush=True)  # fmt: skip
            if args.instructions:
                print(f"{'':>15} | instructions per request: {result['instructions']:,.0f}")
            if result["steps"]:
                steps = ", ".join(f"{k} {v:.0f} us" for k, v in result["steps"].items())
                print(f"{'':>15} | scripts per request: {steps}")
                top = sorted(result["commands"].items(), key=lambda kv: -kv[1][1])[:8]
                calls = ", ".join(f"{name} {usec:.0f} us ({n:.2g}x)" for name, (n, usec) in top)
                print(f"{'':>15} | commands per request: {calls}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
