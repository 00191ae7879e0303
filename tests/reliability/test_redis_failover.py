"""The platform's Redis primary SIGKILLed under Redis Sentinel mid-load, its replica promoted.

The platform runs on a primary, one replica and three sentinels (tests/support/
redis_sentinel.py) through the Sentinel settings, with its fair queue fenced
(GPUSHARE_REDIS_REPLICAS_ACK=1: a decision stands once the replica has it). 40 online
requests (half streamed) are in flight and a batch runs when the primary is killed; once the
sentinels have promoted the replica, the killed server starts again as its replica, as a
deployment's start script does.

What holds:
- no request is answered twice: each request id has one ledger row, each batch line one
  answer;
- none hangs: each in-flight request ends with an answer or a clean OpenAI-shaped error
  (a 503, or a stream's error event and `[DONE]`) within FAILOVER_WINDOW_S of the kill;
- new requests succeed once the replica is promoted and the old primary has rejoined;
- nothing stays reserved, the scheduler's check finds no drift, and every request answered
  200 has its ledger row, with the tokens its client got;
- no job is taken from a live worker: a lease is reaped only for a pick that never ran, or
  from a worker that exited.

It runs twice: on Redis as it comes, and with `min-replicas-to-write 1`, where the new
primary refuses writes until the old one is back as its replica. The Celery worker, web and
beat run under a supervisor, as in test_redis_restart.py: kombu ends a Celery process whose
broker refuses a write, and a deployment starts it again.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.reliability.conftest import Stack, start_stack, stop_stack
from tests.reliability.helpers import (
    Answer,
    Supervisor,
    chat_body,
    make_tenant,
    post,
    reserved_totals,
    scheduler_check,
    usage_rows,
    wait_until,
)
from tests.reliability.test_redis_restart import batch_jsonl, unclean
from tests.support.redis_sentinel import MASTER, SentinelGroup

REQUESTS = 40
BATCH_LINES = 60
# The longest an in-flight request may take to end, answered or refused, after the primary
# dies: the sentinels' down-after (1 s) and election, the old primary's restart as a
# replica, a lease (30 s here) for a pick nobody acknowledged or a run whose worker exited,
# and the answer itself.
FAILOVER_WINDOW_S = 90.0
# The longest after the kill until new requests are answered again (docs/CONFIGURATION.md,
# Redis Sentinel: the failover window).
RECOVERY_S = 30.0


@dataclass
class Timed:
    answer: Answer
    ended_at: float  # time.monotonic()


def timed_post(http: httpx.Client, key: str, body: dict[str, Any]) -> Timed:
    answer = post(http, key, body)
    return Timed(answer, time.monotonic())


@pytest.fixture(scope="module", params=[0, 1], ids=["wait", "wait+min-replicas-to-write"])
def failover_stack(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    """The platform fenced with WAIT, on Redis without, then with `min-replicas-to-write 1`
    (docs/CONFIGURATION.md recommends it: a primary cut off from its replica takes no write;
    with one replica, the new primary takes none until the old one is back)."""
    workdir = tmp_path_factory.mktemp("failover")
    group = SentinelGroup(workdir, min_replicas_to_write=request.param)
    env: dict[str, str | None] = {
        "GPUSHARE_REDIS_SENTINELS": ",".join(group.sentinel_addresses),
        "GPUSHARE_REDIS_SENTINEL_MASTER": MASTER,
        "GPUSHARE_REDIS_REPLICAS_ACK": "1",
        "GPUSHARE_REDIS_REPLICAS_ACK_TIMEOUT_MS": "500",
        "CELERY_BROKER_URL": None,  # made from the sentinels: kombu's sentinel transport
        # Leases outlast the window in which Redis takes no write (their renewals are
        # refused too): a lease that lapsed meanwhile would be reaped from a live worker.
        "GPUSHARE_SCHED_LEASE_S": "30",
    }
    started = start_stack(workdir, "failover-engine", server=group, env=env)
    try:
        yield started
    finally:
        stop_stack(started)


def fair_queue(group: SentinelGroup) -> Any:
    """A fair-queue client in the test process, on the primary the sentinels name."""
    from django.conf import settings

    from fairqueue import FairQueue, config_from_settings

    client = group.sentinel().master_for(MASTER, db=0, decode_responses=True)
    return FairQueue(client, config_from_settings(settings))


def test_nothing_runs_twice_and_nothing_hangs_across_a_sentinel_failover(
    failover_stack: Stack,
) -> None:
    stack = failover_stack
    platform, group = stack.platform, stack.redis
    slug, key = make_tenant(platform, quota_units="8")
    client = openai.OpenAI(base_url=f"{platform.base_url}/v1", api_key=key, max_retries=0)
    uploaded = client.files.create(file=("in.jsonl", batch_jsonl(BATCH_LINES)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    _, prober = make_tenant(platform, quota_units="2")  # its own quota: probes never queue
    bodies = [chat_body(160, stream=i % 2 == 0) for i in range(REQUESTS)]
    with Supervisor(platform, ["worker", "agent", "web", "beat"]) as supervisor:
        in_flight, probes, killed_at = kill_the_primary_under_load(stack, (key, prober), bodies)
    restarts = supervisor.restarts
    # kombu ends a Celery process whose broker refuses a write (NOREPLICAS, while the new
    # primary has no replica in step), and the deployment starts it again.
    print(f"restarted by the supervisor: {restarts or 'nothing'}")

    answers = [t.answer for t in in_flight]
    ended = max(t.ended_at for t in in_flight) - killed_at
    outcomes = Counter(unclean(a) or f"clean {a.status}" for a in answers)
    print(f"in flight across the failover: {dict(outcomes)}, "
          f"the last ended {ended:.1f} s after the kill")  # fmt: skip
    assert [unclean(a) for a in answers if unclean(a)] == []
    assert ended < FAILOVER_WINDOW_S

    # New requests: refused cleanly while the primary is away, answered again after it.
    failed = [at for at, a in probes if a.status != 200]
    window_s = (max(failed) - killed_at) if failed else 0.0
    print(f"new requests from the kill on: "
          f"{dict(Counter(unclean(a) or f'clean {a.status}' for _, a in probes))}; "
          f"the last refused was sent {window_s:.1f} s after the kill")  # fmt: skip
    assert [unclean(a) for _, a in probes if unclean(a)] == []
    assert [a.status for _, a in probes[-6:]] == [200] * 6
    assert window_s < RECOVERY_S

    done = wait_until(
        lambda: (b := client.batches.retrieve(batch.id)).status
        in ("completed", "failed", "expired", "cancelled") and b,
        300, "the batch finished",
    )  # fmt: skip
    assert done.status == "completed", done
    output = client.files.content(done.output_file_id).content.splitlines()
    errors = (
        client.files.content(done.error_file_id).content.splitlines() if done.error_file_id else []
    )
    seen = Counter(json.loads(line)["custom_id"] for line in output + errors if line.strip())
    print(f"batch: {done.status}, {len(output)} lines answered, {len(errors)} errors")
    assert set(seen) == {f"req-{i}" for i in range(BATCH_LINES)}
    assert max(seen.values()) == 1

    queue = fair_queue(group)
    wait_until(lambda: reserved_totals(queue) == (0, 0), 60, "reservations back to zero")
    report = scheduler_check(platform)
    assert "no drift" in report, report

    # The ledger: one row per request id, and each request answered 200 has its own with
    # the tokens its client got.
    rows = wait_until(
        lambda: ledger_settled(platform, slug, answers, batch.id), 60, "the ledger rows"
    )
    ids = Counter(row["request_id"] for row in rows)
    assert max(ids.values()) == 1
    # A batch line's job is `<batch>-<line>-<run>`: a line run twice would have two rows.
    lines_billed = Counter(
        r["request_id"].rsplit("-", 1)[0]
        for r in rows
        if r["request_id"].startswith(f"{batch.id}-")
    )
    assert len(lines_billed) == BATCH_LINES
    assert max(lines_billed.values()) == 1, [line for line, n in lines_billed.items() if n > 1]
    by_id = {row["request_id"]: row for row in rows}
    for answer in answers:
        if answer.status == 200 and answer.body is not None:
            row = by_id[answer.request_id]
            assert row["completion_tokens"] == answer.body["usage"]["completion_tokens"]
            assert row["status_code"] == 200
    print(f"ledger: {len(rows)} rows, one per request id; nothing reserved, no drift")

    # No job was taken from a live worker: a lease is reaped only from a worker that exited
    # (its runs ended with it), or for a pick that was never run: not acknowledged, and its
    # give-back failed too; or made in a worker's turn whose answer was lost (its id unknown
    # to the worker: at most one such job per turn lost).
    reaped, unrun, lost_turns = reaped_and_unrun(platform.workdir / "worker.log")
    print(f"leases reaped: {len(reaped)}, picks neither acknowledged nor given back: "
          f"{len(unrun)}, turns unanswered: {lost_turns}")  # fmt: skip
    if not any(restart.startswith("worker") for restart in restarts):
        assert len(reaped - unrun) <= lost_turns, reaped - unrun


def reaped_and_unrun(log: Path) -> tuple[set[str], set[str], int]:
    """The jobs whose leases housekeeping reaped, those whose pick was neither acknowledged
    nor given back, and how many worker's turns (a release and the next pick) went
    unanswered, as the worker's log says."""
    text = log.read_text(errors="replace")
    reaped = {job for ids in re.findall(r"leases reaped \[([^]]*)\]", text) for job in ids.split()}
    unrun = set(re.findall(r"job (\w+): its pick was not acknowledged nor given back", text))
    lost = len(re.findall(r"job \w+: its release and the next pick went unanswered", text))
    return reaped, unrun, lost


def kill_the_primary_under_load(
    stack: Stack, keys: tuple[str, str], bodies: list[dict[str, Any]]
) -> tuple[list[Timed], list[tuple[float, Answer]], float]:
    """Sends `bodies` at once, SIGKILLs the primary once 8 jobs run, waits for the promotion,
    and starts the killed server again as the new primary's replica. Returns how the requests
    ended, the probes sent from the kill on (the second key's), and when the kill was
    (time.monotonic())."""
    platform, group = stack.platform, stack.redis
    key, prober = keys
    queue = fair_queue(group)
    with httpx.Client(base_url=platform.base_url) as http, ThreadPoolExecutor(len(bodies)) as pool:
        futures = [pool.submit(timed_post, http, key, body) for body in bodies]
        wait_until(lambda: sum(queue.snapshot().engine_inflight.values()) >= 8, 60, "jobs running")
        old, primary = group.master(), group.primary()
        primary.kill()
        killed_at = time.monotonic()
        stop = threading.Event()
        probing = ThreadPoolExecutor(1).submit(probe, platform.base_url, prober, stop)
        new = group.wait_for_new_master(old)
        promoted_s = time.monotonic() - killed_at
        group.restart_as_replica(primary)
        group.wait_replicated(group.primary())
        rejoined_s = time.monotonic() - killed_at
        print(f"\npromoted {new} {promoted_s:.1f} s after the kill; "
              f"the old primary a replica again {rejoined_s:.1f} s after it")  # fmt: skip
        in_flight = [f.result() for f in futures]
        stop.set()
        return in_flight, probing.result(), killed_at


def ledger_settled(
    platform: Any, slug: str, answers: list[Answer], batch_id: str
) -> list[dict[str, Any]] | None:
    """The tenant's ledger rows once every request answered 200 and every line of the batch
    has one."""
    rows = usage_rows(platform, slug)
    have = {row["request_id"] for row in rows}
    wanted = {a.request_id for a in answers if a.status == 200 and a.request_id}
    lines = {r.rsplit("-", 1)[0] for r in have if r.startswith(f"{batch_id}-")}
    return rows if wanted <= have and len(lines) == BATCH_LINES else None


def probe(base_url: str, key: str, stop: threading.Event) -> list[tuple[float, Answer]]:
    """New requests, one after another from the kill on, until `stop` is set and the last 6
    were answered 200 (or two minutes passed): when each was sent, and how it ended."""
    sent: list[tuple[float, Answer]] = []
    with httpx.Client(base_url=base_url) as http:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            at = time.monotonic()
            sent.append((at, post(http, key, chat_body(16, stream=len(sent) % 2 == 1))))
            if stop.is_set() and [a.status for _, a in sent[-6:]] == [200] * 6:
                break
            time.sleep(max(0.0, 0.5 - (time.monotonic() - at)))
    return sent
