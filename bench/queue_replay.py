"""The fair queue alone: Redis's CPU and memory per request, replayed against a redis-server
this script starts (its own port, no persistence, nothing else on it).

Each request's life in Redis, as the platform lives it: the web admits it (its tenant's
limits script) and enqueues it with a 2 KB body (`enqueue_summoning`); when a running request
ends, its worker releases it with its last words (the `done` event to the web's inbox, its
ledger row) and picks the pool's next job in the same call (`release_and_pick`, the
dispatcher's turn); the web reads its inbox, and the tokens the request did not use go back
to its limits (each engine's worker sums its requests' refunds and writes them every half
second: `Settlements`). The ledger's rows are drained as the flusher drains them.
The engines are simulated (a running request ends when its turn comes, at random): they
take no CPU, and every seat stays busy, with a queue of at least 2,000 behind them. The
engines reserve KV as the platform's do by default (`predict`: a job's prompts and the output
its tenant's answers predict; --reservation worst), and every tenant has answered in the
pool before: its latest answer lengths are all there, as in a platform that has run a while.

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
    .venv/bin/python bench/queue_replay.py --cluster  # the same on a cluster of 3 primaries
    .venv/bin/python bench/queue_replay.py --clients 4  # 4 processes replaying at once

One client makes one call at a time, so Redis waits for each call and wakes up for it: the
kernel's share of a call is then the largest it gets. A fleet's web processes and engines'
workers call together, and a busy Redis serves several calls per wake-up. With --clients N,
N processes (forked once every seat is busy) each take a share of the running jobs and of
the requests, and replay them at once; every job's admission is settled from its payload,
as a worker does, whichever process picked it.

With --cluster, the same replay runs on a Redis Cluster of --primaries primaries (3) this
script starts (tests/support/redis_cluster.py: free ports, no persistence), through redis-py's
RedisCluster, the threads' client. Every fair-queue call declares one key, its pool's hash
tag `{p:<pool>}`, and is routed to that slot's primary; a tenant's quota is leased to its
pools from the tenant's own slot (`{t:<tenant>}`, fairqueue/leases.py). The replay has
--pools pools (one per primary), each with the shape's engines; tenant i sends to pool
i mod pools (each request goes to a pool drawn at random, then to one of its tenants), or
to that pool and the next ones (--tenant-pools: its quota is leased to them in turn, and
housekeeping's rebalance of the leases runs every 2 s). The tenants' limits
(tenants/limits.py) run through the same cluster client; a step that Redis Cluster refuses
(keys in several slots, or not declared) is skipped, and named with Redis's answer. It
prints the CPU per request summed over the primaries, each primary's, and the fleet's
ceiling: the requests per second one primary carries at the cluster's CPU per request,
times the primaries; and the busiest primary's own limit (one CPU second per second, at its
CPU per request of the fleet's).
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
HOUSEKEEPING_S = 2.0  # GPUSHARE_HOUSEKEEPING_INTERVAL_S's default
WATCH_S = 0.5  # a worker's flush of its settlements (workers/dispatch.py WATCH_S)
OUT_SAMPLES = 64  # the answer lengths kept per tenant and pool (lua/lib.lua OUT_SAMPLES)
# A job's KV: 512 prompt tokens and up to 88 of output, at 128 KiB a token (its worst case),
# or its prompts and the output its tenant's answers predict (the engines' `predict` mode).
KV_TOKEN = 128 * 1024
KV_FLOOR = 512 * KV_TOKEN
KV_BYTES = KV_FLOOR + 88 * KV_TOKEN


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


def command_stats(nodes: list[Any]) -> dict[str, tuple[int, float]]:
    """Each command's calls and time (us) so far, summed over `nodes` (the redis-servers)."""
    total: dict[str, tuple[int, float]] = {}
    for node in nodes:
        for name, v in node.info("commandstats").items():
            calls, usec = total.get(name.removeprefix("cmdstat_"), (0, 0.0))
            total[name.removeprefix("cmdstat_")] = (calls + int(v["calls"]),
                                                    usec + float(v["usec"]))  # fmt: skip
    return total


# A script's time counts the commands it calls, which INFO commandstats counts again under
# their own names: the scripts' time is read from these alone.
SCRIPT_COMMANDS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")


def script_usec(nodes: list[Any]) -> float:
    """The time Redis spent in scripts and functions (EVALSHA, EVAL, FCALL) so far."""
    return float(sum(node.info("commandstats").get(f"cmdstat_{name}", {}).get("usec", 0)
                     for node in nodes for name in SCRIPT_COMMANDS))  # fmt: skip


class Breakdown:
    """Each step's script time, read around it (--breakdown: slower, for finding the cost)."""

    def __init__(self, nodes: list[Any], on: bool) -> None:
        self.nodes, self.on = nodes, on
        self.usec: dict[str, float] = {}

    def step(self, name: str, work: Any) -> Any:
        if not self.on:
            return work()
        before = script_usec(self.nodes)
        result = work()
        self.usec[name] = self.usec.get(name, 0.0) + script_usec(self.nodes) - before
        return result


def server_cpu_s(node: Any) -> float:
    info = node.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def server_sys_s(node: Any) -> float:
    """The server's CPU in the kernel: its calls' reads, writes and waits for the next."""
    return float(node.info("cpu")["used_cpu_sys"])


def used_memory(nodes: list[Any]) -> int:
    return sum(int(node.info("memory")["used_memory"]) for node in nodes)


def key_count(nodes: list[Any]) -> int:
    return sum(int(node.dbsize()) for node in nodes)


def settled_memory(nodes: list[Any], keys: int) -> int:
    """used_memory once the keys that expired are gone: Redis removes them in its own time,
    so wait until the key count stops falling to `keys` or below."""
    for _ in range(200):
        if key_count(nodes) <= keys:
            break
        time.sleep(0.05)
    return used_memory(nodes)


@dataclass
class Shape:
    engines: int
    tenants: int


@dataclass
class Target:
    """Where a replay runs: the client of its own calls (the inbox, the ledger, memory), the
    fair queue, and the redis-servers whose INFO it reads (one, or each primary)."""

    client: Any
    queue: Any
    nodes: list[Any]
    counter: Server | None = None  # the server whose instructions are counted (callgrind)
    skip_admit: str = ""  # why the limits' admission is not replayed ('': it is)


class Replay:
    def __init__(
        self,
        target: Target,
        shape: Shape,
        pools: list[str],
        tenant_pools: int = 1,
        reservation: str = "predict",
        clients: int = 1,
    ) -> None:
        from fairqueue.domain import EnginePolicy, TenantPolicy
        from tenants.models import Tenant
        from tenants.usage_buffer import outbox

        self.target = target
        self.client = target.client
        self.nodes = target.nodes
        self.client.flushall()  # every primary of a cluster
        self.queue = target.queue
        self.shape = shape
        self.pools = pools
        self.pending_keys = [outbox(pool) for pool in pools]
        for pool in pools:
            for i in range(shape.engines):
                engine = f"e{i}" if len(pools) == 1 else f"{pool}-e{i}"
                self.queue.set_engine_policy(
                    EnginePolicy(engine, pool, 40 * GIB, SEATS_PER_ENGINE, queued=0,
                                 reservation=reservation)
                )  # fmt: skip
        self.slugs = [f"t{i}" for i in range(shape.tenants)]
        self.tenants = []
        for i, slug in enumerate(self.slugs):
            self.queue.set_tenant_policy(slug, TenantPolicy(1 + i % 4, 1000 * GIB))
            self.tenants.append(Tenant(pk=i + 1, slug=slug, rpm_limit=10**7, tpm_limit=10**10))
        # Tenant i sends to pool i mod pools, and the next tenant_pools - 1 (one pool: every
        # tenant to it).
        self.tenant_pools = tenant_pools
        self.members = [
            [i for i in range(shape.tenants)
             if any((i + k) % len(pools) == j for k in range(tenant_pools))]
            for j in range(len(pools))
        ]  # fmt: skip
        if not all(self.members):
            raise SystemExit(f"{shape.tenants} tenants leave a pool of {len(pools)} unused")
        # Every tenant has answered in each pool before: its latest answer lengths are all
        # kept (OUT_SAMPLES), as in a platform that has run a while, so each answer's
        # prediction is made from all of them.
        for pool in pools:
            for slug in self.slugs:
                key = self.queue.keys.output_lengths(pool, slug)
                self.client.lpush(key, *[str(70 + k % 20) for k in range(OUT_SAMPLES)])
                self.client.expire(key, 24 * 3600)
        self.rebalanced = 0
        self.empty: list[str] = []  # a seat left empty, by its pool
        self.left_empty = 0
        self.rng = random.Random(7)
        self.inboxes = {pool: self.queue.keys.inbox(pool, INBOX) for pool in pools}
        self.clients = clients
        self.breakdown = Breakdown(self.nodes, False)
        # The dispatcher's turn picks for the engine its job ran on (a tree from before that
        # had no choice: it looked at every engine of the pool).
        turn = inspect.signature(self.queue.release_and_pick).parameters
        self.turn: dict[str, Any] = {"same_engine": True} if "same_engine" in turn else {}
        # Each engine's worker settles its requests' limits in a flush every WATCH_S (a tree
        # from before: each at its end, None).
        import tenants.limits

        self.settlements: dict[str, Any] | None = (
            {} if hasattr(tenants.limits, "Settlements") else None
        )
        self.flushes = 0  # the workers' flushes of settlements that had some
        # Each job carries its tenant's prefix-cache affinity key, as the web's do (where the
        # queue knows of affinity: a replay of an older commit runs without).
        self.affine = "affinity" in inspect.signature(self.queue.enqueue_args).parameters

    def admit(self, i: int) -> Any:
        from tenants.limits import Admission, limits_admit

        if self.target.skip_admit:  # what settling it needs, as if it had been counted
            return Admission(i + 1, 600, int(time.time() // 60), None)
        return limits_admit(tenant=self.tenants[i], estimated_tokens=600)

    def arrive(self, pool_index: int | None = None) -> None:
        j = pool_index if pool_index is not None else (
            self.rng.randrange(len(self.pools)) if len(self.pools) > 1 else 0)  # fmt: skip
        pool, members = self.pools[j], self.members[j]
        i = members[self.rng.randrange(len(members))]
        admission = self.breakdown.step("admit", lambda: self.admit(i))
        inbox = self.inboxes[pool]
        payload = {"inbox": inbox, "endpoint": "chat", "stream": False,
                   "body": {"model": pool, "messages": [{"role": "user", "content": BODY}]},
                   "tenant_id": i + 1, "model": pool, "admission": admission.settling_fields(),
                   "received_at": time.time()}  # fmt: skip
        summary = {k: v for k, v in payload.items() if k != "body"}
        self.breakdown.step("enqueue", lambda: self.queue.enqueue_summoning(
            tenant=self.slugs[i], pool=pool, request_class="standard", prompt_tokens=512,
            max_tokens=88, kv_bytes=KV_BYTES, kv_floor=KV_FLOOR, kv_token=KV_TOKEN,
            payload=json.dumps(payload),
            summary=json.dumps(summary), inbox=inbox,
            **({"affinity": f"tenant:{i + 1}"} if self.affine else {}),
        ))  # fmt: skip

    def fill_one(self, pool: str) -> Any:
        job = self.queue.pick(pool)
        if job is None:
            raise RuntimeError("nothing to pick")
        return job

    def fill(self) -> list[Any]:
        running = []
        for pool in self.pools:
            for _ in range(self.shape.engines * SEATS_PER_ENGINE):
                job = self.queue.pick(pool)
                if job is None:
                    if self.tenant_pools == 1:
                        raise RuntimeError("a seat stayed empty")
                    self.empty.append(pool)  # its tenants' quota is leased to other pools
                else:
                    running.append(job)
        for _ in range(20):  # housekeeping's turns until every seat is busy
            if not self.empty:
                return running
            self.housekeeping(running)
        raise RuntimeError("seats stayed empty through 20 rebalances of the leases")

    def housekeeping(self, running: list[Any]) -> None:
        """Housekeeping's rebalance of the starved tenants' leases, and a pick for each empty
        seat (the pool's loop, kicked)."""
        self.rebalanced += len(self.queue.rebalance_leases())
        empty, self.empty = self.empty, []
        for pool in empty:
            job = self.queue.pick(pool)
            if job is None:
                self.empty.append(pool)
            else:
                running.append(job)

    def end(self, job: Any) -> Any:
        """The job's run ends: released with its last words and the pool's next pick; the
        web reads its answer and settles its limits."""
        from fairqueue.queue import LastWords
        from tenants.limits import Admission, Settlements, limits_settle
        from tenants.usage_buffer import outbox

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
                "model": job.pool,
                "finished_at": time.time(),
            }
        )
        words = LastWords(event=done, outbox=outbox(job.pool), entry=row, ttft_s=0.2)
        _, next_job = self.breakdown.step("release_pick", lambda: self.queue.release_and_pick(
            job, 500, 80, pool=job.pool, last_words=words, **self.turn
        ))  # fmt: skip
        self.client.lpop(self.inboxes[job.pool], 16)
        # What its worker settles, from the job's payload, as the worker reads it.
        admission = Admission(**json.loads(job.payload)["admission"])
        if self.settlements is None:  # a tree from before: each request settled at its end
            self.breakdown.step("settle", lambda: limits_settle(admission=admission,
                                                                used_tokens=580))  # fmt: skip
        else:
            self.settlements.setdefault(job.engine_id, Settlements()).add(
                admission=admission, used_tokens=580
            )
        return next_job

    def flush_settlements(self) -> None:
        """Each engine's worker writes its settlements every WATCH_S (workers/dispatch.py)."""
        for settlements in (self.settlements or {}).values():
            if settlements.pending:
                self.flushes += 1
                self.breakdown.step("settle", settlements.flush)

    def turns(self, requests: int, running: list[Any], keep_s: float, started: float) -> None:
        """`requests` requests' lives, one after the other: each ends a running job, whose
        worker picks the next, and a new one arrives."""
        housekept = flushed = time.perf_counter()
        for turn in range(requests):
            if time.perf_counter() - started > keep_s:
                raise RuntimeError("the replay outlasted --keep-s: finished jobs expired in it")
            self.arrive()
            job = running.pop(self.rng.randrange(len(running)))
            next_job = self.end(job)
            if next_job is not None:
                running.append(next_job)
            elif self.tenant_pools == 1:
                raise RuntimeError("a released seat was not refilled")
            else:  # until housekeeping brings its tenants' leases back
                self.empty.append(job.pool)
                self.left_empty += 1
            if time.perf_counter() - flushed >= WATCH_S:
                flushed = time.perf_counter()
                self.flush_settlements()
            if turn % 100 == 99:  # the ledger's flusher
                for key in self.pending_keys:
                    self.client.ltrim(key, 100, -1)
            if self.tenant_pools > 1 and time.perf_counter() - housekept >= HOUSEKEEPING_S:
                housekept = time.perf_counter()
                self.housekeeping(running)
        self.flush_settlements()

    def turns_at_once(
        self, requests: int, running: list[Any], keep_s: float, started: float
    ) -> None:
        """The same turns from `clients` processes at once, as a fleet's web processes and
        engines' workers call Redis: each takes a share of the running jobs and of the
        requests. Redis then serves several calls per wake-up, as it does under load, rather
        than waking for each call of one client."""
        import multiprocessing

        context = multiprocessing.get_context("fork")
        shares = [running[k :: self.clients] for k in range(self.clients)]
        pipes, children = [], []
        for k, share in enumerate(shares):
            reader, writer = context.Pipe(duplex=False)
            child = context.Process(target=self._turns_of_child,
                                    args=(k, requests // self.clients, share, keep_s, started,
                                          writer))  # fmt: skip
            child.start()
            pipes.append(reader)
            children.append(child)
        failures = []
        for child, reader in zip(children, pipes, strict=True):
            result = reader.recv() if reader.poll(keep_s + 60) else {"error": "no answer"}
            child.join(10)
            if "error" in result:
                failures.append(result["error"])
            else:
                self.flushes += result["flushes"]
                self.left_empty += result["left_empty"]
        if failures:
            raise RuntimeError(f"a client of the replay failed: {failures[0]}")

    def _turns_of_child(
        self, k: int, requests: int, share: list[Any], keep_s: float, started: float, pipe: Any
    ) -> None:
        # A forked child: redis-py opens its own connections (its pools see the new pid).
        try:
            self.rng = random.Random(7 + k)
            self.flushes = self.left_empty = 0
            self.settlements = {} if self.settlements is not None else None
            self.turns(requests, share, keep_s, started)
            pipe.send({"flushes": self.flushes, "left_empty": self.left_empty})
        except BaseException as exc:  # told to the parent, which raises it
            pipe.send({"error": f"{type(exc).__name__}: {exc}"})
        finally:
            pipe.close()
            os._exit(0)

    def run(self, requests: int, keep_s: int, breakdown: bool) -> dict[str, Any]:
        client, nodes, counter = self.client, self.nodes, self.target.counter
        requests -= requests % self.clients  # an equal share for each client
        # One request's whole life first (in each pool): every script is loaded (a script's
        # text is Redis memory too), and the pool's own keys exist.
        for j, pool in enumerate(self.pools):
            self.arrive(j)
            first = self.fill_one(pool)
            self.end(first)
        self.flush_settlements()
        for key in [*self.inboxes.values(), *self.pending_keys]:
            client.delete(key)
        empty = used_memory(nodes)
        seats = self.shape.engines * SEATS_PER_ENGINE * len(self.pools)
        waiting = max(seats, 2000)  # a queue behind the seats (and many to measure)
        for _ in range(seats + waiting):
            self.arrive()
        with_waiting = used_memory(nodes)
        running = self.fill()
        in_flight = used_memory(nodes)
        keys_in_flight = key_count(nodes)
        # Waiting jobs: (seats + waiting) enqueued; then `seats` of them picked.
        per_waiting = (with_waiting - empty) / (seats + waiting)
        per_running = per_waiting + (in_flight - with_waiting) / seats
        idle_ms_s: list[float] = []
        if len(nodes) > 1:  # what the primaries spend idle (cron, the cluster's bus), per s
            before_idle = [server_cpu_s(node) for node in nodes]
            time.sleep(2)
            idle_ms_s = [
                (server_cpu_s(n) - b) * 1000 / 2 for n, b in zip(nodes, before_idle, strict=True)
            ]
        commands = [command_stats([node]) for node in nodes]
        cpu = [server_cpu_s(node) for node in nodes]
        kernel = sum(server_sys_s(node) for node in nodes)
        started = time.perf_counter()
        self.breakdown.on = breakdown
        self.rebalanced = self.flushes = 0
        if counter is not None:
            counter.count(True)
        if self.clients == 1:
            self.turns(requests, running, keep_s, started)
        else:
            self.turns_at_once(requests, running, keep_s, started)
        replay_s = time.perf_counter() - started
        kernel_ms = (sum(server_sys_s(node) for node in nodes) - kernel) / requests * 1000
        if counter is not None:
            counter.count(False)
        counting = counter is not None and counter.counting
        instructions = counter.instructions() / requests if counter and counting else 0.0
        self.breakdown.on = False
        per_node = []
        spent: dict[str, tuple[float, float]] = {}
        for node, before, cpu_before in zip(nodes, commands, cpu, strict=True):
            node_spent = {
                name: ((calls - before.get(name, (0, 0.0))[0]) / requests,
                       (usec - before.get(name, (0, 0.0))[1]) / requests)
                for name, (calls, usec) in command_stats([node]).items()
            }  # fmt: skip
            for name, (n, usec) in node_spent.items():
                was = spent.get(name, (0.0, 0.0))
                spent[name] = (was[0] + n, was[1] + usec)
            node_usec = sum(node_spent[n][1] for n in SCRIPT_COMMANDS if n in node_spent)
            per_node.append((node_usec, (server_cpu_s(node) - cpu_before) / requests * 1000))
        usec = sum(node_usec for node_usec, _ in per_node)
        cpu_ms = sum(node_cpu for _, node_cpu in per_node)
        for key in self.pending_keys:
            client.delete(key)
        finished = used_memory(nodes)
        per_finished = (finished - in_flight) / requests
        if counting:  # slowed down many times: the window is not waited for
            per_finished_after, sample_bytes = float("nan"), 0
        else:
            time.sleep(max(0.0, keep_s + 0.5 - (time.perf_counter() - started)))
            # What stays per tenant, not per request: its answer-length samples (a day).
            samples = []
            for pool in self.pools:
                samples += [*client.scan_iter(self.queue.keys.output_lengths(pool, "*"))]
                samples.append(self.queue.keys.output_predictions(pool))
            sample_bytes = sum(int(client.memory_usage(key) or 0) for key in samples)
            after = settled_memory(nodes, keys_in_flight) - sample_bytes
            per_finished_after = max(0.0, (after - in_flight) / requests)
        return {"usec": usec, "cpu_ms": cpu_ms, "kernel_ms": kernel_ms, "per_waiting": per_waiting,
                "per_running": per_running, "per_finished": per_finished,
                "per_finished_after": per_finished_after,
                "per_tenant": sample_bytes / self.shape.tenants, "commands": spent,
                "instructions": instructions, "per_node": per_node, "idle_ms_s": idle_ms_s,
                "replay_s": replay_s, "rebalanced": self.rebalanced,
                "left_empty": self.left_empty, "empty_at_end": len(self.empty),
                "settled_per_flush": requests / self.flushes if self.flushes else 0.0,
                "steps": {k: v / requests for k, v in self.breakdown.usec.items()}}  # fmt: skip


def spread_pools(client: Any, keys: Any, count: int) -> list[str]:
    """`count` pool names whose slots the cluster's primaries serve evenly (as evenly as
    `count` allows): bench0, bench1, ... each kept while its primary has fewer than its
    share."""
    primaries = len(client.get_primaries())
    share = -(-count // primaries)
    taken: dict[str, int] = {}
    pools: list[str] = []
    n = 0
    while len(pools) < count:
        pool = f"bench{n}"
        n += 1
        node = client.get_node_from_key(keys.pool_tag(pool)).name
        if taken.get(node, 0) < share:
            taken[node] = taken.get(node, 0) + 1
            pools.append(pool)
    return pools


def cluster_limits(client: Any, tenant: Any) -> tuple[str, list[str]]:
    """The tenants' limits (tenants/limits.py) through the cluster client, as the web would
    call them were its Redis the cluster: why the admission cannot be replayed ('': it
    can), and what else Redis Cluster refuses that the replay does not need."""
    import redis

    import tenants.limits
    from tenants.limits import Admission, limits_admit, limits_settle

    # The limits' scripts are registered with the process's Redis client: the cluster's.
    tenants.limits.redis_client = lambda: client
    errors = (redis.exceptions.ResponseError, redis.exceptions.RedisClusterException)
    skip = ""
    for _ in range(12):  # several calls: a script routed wrongly may still hit its own slot
        try:
            limits_admit(tenant=tenant, estimated_tokens=600)
        except errors as error:
            skip = f"{type(error).__name__}: {error}"
            break
    others = []
    minute = int(time.time() // 60)
    budget = f"{tenants.limits.tenant_slot(tenant.pk)}budget:20261201"
    for what, admission in (
        ("settle of a tenant with a token budget",
         Admission(tenant.pk, 600, minute, budget)),
        ("settle of a key with its own limits",
         Admission(tenant.pk, 600, minute, None, api_key_id=1)),
    ):  # fmt: skip
        try:
            limits_settle(admission=admission, used_tokens=580)
        except errors as error:
            others.append(f"{what}: {type(error).__name__}: {error}")
    return skip, others


def print_shape(shape: Shape, result: dict[str, Any], instructions: bool) -> None:
    # Under callgrind the times are callgrind's: its instructions stand in for them.
    usec, cpu = (f"{'-':>10}", f"{'-':>10}") if instructions else (
        f"{result['usec']:>10.0f}", f"{result['cpu_ms']:>10.3f}")  # fmt: skip
    print(f"{shape.engines:>7} {shape.tenants:>7} | {usec} "
          f"{cpu} | {result['per_waiting']:>9.0f} "
          f"{result['per_running']:>11.0f} {result['per_finished']:>10.0f} "
          f"{result['per_finished_after']:>14.0f} | {result['per_tenant']:>12.0f}",
          flush=True)  # fmt: skip
    if instructions:
        print(f"{'':>15} | instructions per request: {result['instructions']:,.0f}")
    else:
        print(f"{'':>15} | of the cpu column, in the kernel: {result['kernel_ms']:.3f} ms/req")
    if result["settled_per_flush"]:
        print(f"{'':>15} | requests settled per flush of a worker's settlements: "
              f"{result['settled_per_flush']:.1f}")  # fmt: skip
    if result["steps"]:
        steps = ", ".join(f"{k} {v:.0f} us" for k, v in result["steps"].items())
        print(f"{'':>15} | scripts per request: {steps}")
        top = sorted(result["commands"].items(), key=lambda kv: -kv[1][1])[:8]
        calls = ", ".join(f"{name} {usec:.0f} us ({n:.2g}x)" for name, (n, usec) in top)
        print(f"{'':>15} | commands per request: {calls}")


def print_primaries(result: dict[str, Any], names: list[str], requests: int) -> None:
    """Each primary's share of the CPU per request, and the fleet's ceiling from it."""
    per_node, total = result["per_node"], result["cpu_ms"]
    for name, (usec, cpu_ms), idle in zip(names, per_node, result["idle_ms_s"], strict=True):
        print(f"{'':>15} | {name}: script {usec:.0f} us, cpu {cpu_ms:.3f} ms/req "
              f"({cpu_ms / total:.0%}); idle {idle:.2f} ms/s")  # fmt: skip
    idle_ms = sum(result["idle_ms_s"]) * result["replay_s"] / requests
    busiest = max(cpu_ms for _, cpu_ms in per_node)
    shards = len(per_node)
    print(f"{'':>15} | idle CPU of the primaries in this replay ({result['replay_s']:.1f} s): "
          f"{idle_ms:.3f} ms/req of the cpu column")  # fmt: skip
    print(f"{'':>15} | fleet ceiling = {shards} primaries x 1000 / {total:.3f} ms per request "
          f"= {shards * 1000 / total:,.0f} req/s; the busiest primary, at {busiest:.3f} ms "
          f"per request of the fleet, caps it at 1000 / {busiest:.3f} = "
          f"{1000 / busiest:,.0f} req/s")  # fmt: skip


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
                        "measure, e.g. '--zset-max-listpack-entries 16' (with --cluster, "
                        "set on each primary with CONFIG SET once it runs)")  # fmt: skip
    parser.add_argument("--reservation", choices=("predict", "worst"), default="predict",
                        help="the engines' KV reservation mode (predict: the platform's "
                        "default, GPUSHARE_KV_RESERVATION)")  # fmt: skip
    parser.add_argument("--no-admit", action="store_true",
                        help="skip the limits' admission (its settle still runs), as the "
                        "cluster replay must: the same lifecycle on both")  # fmt: skip
    parser.add_argument("--clients", type=int, default=1,
                        help="processes that replay at once, each with a share of the running "
                        "jobs and of the requests, as a fleet's web processes and workers "
                        "call Redis together (1: one call at a time, and Redis waits for "
                        "each)")  # fmt: skip
    parser.add_argument("--cluster", action="store_true",
                        help="replay on a Redis Cluster of its own (--primaries), through "
                        "redis-py's RedisCluster")  # fmt: skip
    parser.add_argument("--primaries", type=int, default=3,
                        help="with --cluster: its primaries")  # fmt: skip
    parser.add_argument("--tenant-pools", type=int, default=1,
                        help="with --cluster: the pools each tenant sends to (more than one: "
                        "its quota is leased to them in turn, and housekeeping's rebalance "
                        f"runs every {HOUSEKEEPING_S:g} s)")  # fmt: skip
    parser.add_argument("--pools", type=int, default=None,
                        help="with --cluster: the pools, spread over the primaries, each with "
                        "the shape's engines (default: one per primary)")  # fmt: skip
    args = parser.parse_args()
    if args.pools is None:
        args.pools = args.primaries
    if args.cluster and args.instructions:
        parser.error("--instructions counts one redis-server: not with --cluster")
    if args.clients < 1:
        parser.error("--clients is at least 1")
    if args.clients > 1 and (args.breakdown or args.tenant_pools > 1):
        parser.error("--clients replays one pool per tenant, without --breakdown")

    shapes = [Shape(int(e), 100) for e in args.engines.split(",")]
    shapes += [Shape(8, int(t)) for t in args.tenants.split(",") if int(t) != 100]
    os.environ["GPUSHARE_SCHED_KEEP_S"] = str(args.keep_s)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    if args.cluster:
        with tempfile.TemporaryDirectory(prefix="queue-replay-") as workdir:
            replay_cluster(args, shapes, Path(workdir))
        return

    import redis

    server = Server.start(counting=args.instructions, extra=tuple(args.redis_args.split()))
    os.environ["REDIS_URL"] = server.url
    import django

    django.setup()
    from scheduler.pools.policies import fair_queue

    client = redis.Redis.from_url(server.url)
    skip = "--no-admit" if args.no_admit else ""
    target = Target(client, fair_queue(), [client], counter=server, skip_admit=skip)
    print(f"redis-server {server.version}, {args.requests} requests per shape, "
          f"{SEATS_PER_ENGINE} seats per engine, a 2 KB body each, "
          f"{clients_said(args.clients)}")  # fmt: skip
    if skip:
        print(f"skipped: the limits' admission (limits_admit), {skip}; its settle still runs, "
              "on a counter the admission did not write")  # fmt: skip
    print_header()
    try:
        for shape in shapes:
            replay = Replay(
                target, shape, [POOL], reservation=args.reservation, clients=args.clients
            )
            result = replay.run(args.requests, args.keep_s, args.breakdown)
            print_shape(shape, result, args.instructions)
    finally:
        server.stop()


def clients_said(clients: int) -> str:
    if clients == 1:
        return "replayed by one client, one call at a time"
    return f"replayed by {clients} clients at once"


def print_header() -> None:
    print(
        f"{'engines':>7} {'tenants':>7} | {'script us':>10} {'cpu ms/req':>10} | "
        f"{'waiting B':>9} {'in flight B':>11} {'finished B':>10} {'after window B':>14} | "
        f"{'per tenant B':>12}"
    )


def replay_cluster(args: argparse.Namespace, shapes: list[Shape], workdir: Path) -> None:
    """The same replay on a cluster of `--primaries` primaries of its own."""
    import redis
    from redis.cluster import RedisCluster as PyRedisCluster

    from tests.support.redis_cluster import RedisCluster

    cluster = RedisCluster(workdir, primaries=args.primaries)
    try:
        cluster.start()
        extra = args.redis_args.split()
        nodes = [redis.Redis(port=node.port) for node in cluster.nodes]
        for node in nodes:
            for name, value in zip(extra[::2], extra[1::2], strict=True):
                node.config_set(name.removeprefix("--"), value)
        os.environ["REDIS_URL"] = cluster.url
        import django

        django.setup()
        from django.conf import settings

        from fairqueue.domain import config_from_settings
        from fairqueue.queue import FairQueue
        from tenants.models import Tenant

        # The threads' client, as the platform's (decode_responses), and the bench's own.
        threads = PyRedisCluster.from_url(cluster.url, decode_responses=True)
        client = PyRedisCluster.from_url(cluster.url)
        queue = FairQueue(threads, config_from_settings(settings))  # type: ignore[arg-type]
        queue.load_library()  # on every primary
        pools = spread_pools(client, queue.keys, args.pools)
        probe = Tenant(pk=1, slug="t0", rpm_limit=10**7, tpm_limit=10**10)
        skip, refused = cluster_limits(threads, probe)
        target = Target(client, queue, nodes, skip_admit=skip)
        version = nodes[0].info("server")["redis_version"]
        owners: dict[int, list[str]] = {node.port: [] for node in cluster.nodes}
        for pool in pools:
            owners[client.get_node_from_key(queue.keys.pool_tag(pool)).port].append(pool)
        names = [f"primary :{port} ({', '.join(owned) or 'no pool'})"
                 for port, owned in owners.items()]  # fmt: skip
        sends = f" and the next {args.tenant_pools - 1}" if args.tenant_pools > 1 else ""
        print(f"redis-server {version}, a cluster of {len(nodes)} primaries (no replicas), "
              f"{len(pools)} pools ({', '.join(pools)}), tenant i sending to pool i mod "
              f"{len(pools)}{sends}; {args.requests} requests per shape, "
              f"{SEATS_PER_ENGINE} seats per engine, a 2 KB body each; engines are per "
              f"pool; {clients_said(args.clients)}")  # fmt: skip
        if skip:
            print(f"skipped: the limits' admission (limits_admit): Redis Cluster refused it: "
                  f"{skip}; its settle still runs (limits_settle, one key: the tenant's tokens "
                  f"this minute), on a counter the admission did not write")  # fmt: skip
        for line in refused:
            print(f"not replayed (the replay's tenants have neither), refused too: {line}")
        print(
            "script us and cpu ms/req: summed over the primaries; fleet ceiling: the "
            "requests/s one primary carries at that CPU per request, times the primaries"
        )
        print_header()
        for shape in shapes:
            replay = Replay(target, shape, pools, args.tenant_pools, args.reservation, args.clients)
            result = replay.run(args.requests, args.keep_s, args.breakdown)
            print_shape(shape, result, False)
            if args.tenant_pools > 1:
                print(f"{'':>15} | releases that left their seat empty (no tenant's lease "
                      f"let the pool pick): {result['left_empty']} of {args.requests}; "
                      f"housekeeping rebalanced the leases of {result['rebalanced']} starved "
                      f"pools in {result['replay_s']:.1f} s; seats empty at the end: "
                      f"{result['empty_at_end']}")  # fmt: skip
            print_primaries(result, names, args.requests)
        threads.close()
        client.close()
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
