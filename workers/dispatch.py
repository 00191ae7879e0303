"""A worker thread's loop: pick the fairest admissible job of a pool, run it, record it.

One `dispatch(pool)` task keeps its thread busy while the pool has admissible work, so a job
that ends makes room for the next one without waiting for a new message. With nothing to
run, the loop waits for new work (`GPUSHARE_DISPATCH_IDLE_S`, a minute) before it ends: the
web hands a request to a waiting loop through Redis instead of sending a Celery message (a
message costs the sender, the worker and Redis several ms of CPU, more than the rest of the
request's handling; bench/online_overhead.py). A loop summoned by a message fans out: if
more work waits and no loop is idle, it summons the next one. Housekeeping wakes or summons
a loop for pools that still have waiting work, in case a message or a wake-up was lost.

Loops wait instead of ending, so a worker process runs at most its thread count less
`GPUSHARE_WORKER_FREE_THREADS` of them: the threads left over run every other task (engine
starts and stops, batch kicks) without waiting for a loop to end. A summons beyond that
returns at once: this process's loops are all busy, and the first to finish its job picks
the next (release and pick are one step).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from celery.signals import celeryd_after_setup, worker_shutting_down
from django.conf import settings
from django.db import connection

from config import wire
from config.change_marks import cache_by_marks
from config.ttlcache import TtlCache
from scheduler.batches import batch_line_finished
from scheduler.engines.supervisor import engine_check_unreachable, shared_engine_client
from scheduler.fairqueue.domain import DispatchLoop, Job
from scheduler.fairqueue.queue import FairQueue, LastWords
from scheduler.models import Engine
from scheduler.pools import engine_changes, fair_queue
from scheduler.units import UNIT_BYTES
from tenants.limits import Admission, limits_settle
from tenants.usage_buffer import PENDING_KEY as USAGE_PENDING_KEY
from workers.runner import RunResult, reserved_unit_seconds, run_job

log = logging.getLogger(__name__)


# Engines by name, for their address: a moved or removed engine is seen within the TTL (and a
# job picked for an engine that is gone is given back to its queue). Read again only after an
# engine's row was saved (its change mark), or every GPUSHARE_CHANGE_RECHECK_S.
_engines: TtlCache[Engine | None] = cache_by_marks(5.0, engine_changes)
# How long one dispatch task keeps its thread before it hands the pool's remaining work to a
# new message: a bound on how long its message stays unacknowledged in the broker (far below
# the visibility timeout). The threads other tasks need are kept free by the loop seats.
DISPATCH_TURN_S = 600.0


class _LoopSeats:
    """How many dispatch loops this process may run at once: its thread count less the
    threads kept free for other tasks; unbounded outside a worker (tests, shells)."""

    def __init__(self) -> None:
        self._seats: threading.BoundedSemaphore | None = None
        self.stopping = threading.Event()  # the worker is shutting down: loops end

    def size_for(self, worker_threads: int) -> None:
        free = int(settings.GPUSHARE_WORKER_FREE_THREADS)
        self._seats = threading.BoundedSemaphore(max(1, worker_threads - free))

    def take(self) -> bool:
        return self._seats is None or self._seats.acquire(blocking=False)

    def give_back(self) -> None:
        if self._seats is not None:
            self._seats.release()


loop_seats = _LoopSeats()


@celeryd_after_setup.connect
def _size_loop_seats(sender: str, instance: Any, **_: Any) -> None:
    loop_seats.size_for(int(instance.concurrency))


@worker_shutting_down.connect
def _stop_loops(**_: Any) -> None:
    loop_seats.stopping.set()  # a warm shutdown must not wait out idle loops


def dispatch_pool(
    pool: str, *, turn_s: float = DISPATCH_TURN_S, idle_s: float | None = None
) -> int:
    """Runs the pool's admissible jobs one after another; returns how many ran. Each job's
    release, its answer and ledger row (`last_words`) and the next pick are one step (one
    round trip to Redis). With nothing admissible, waits up to `idle_s` (default
    `GPUSHARE_DISPATCH_IDLE_S`) for work (see the module docstring), until the turn is over."""
    if not loop_seats.take():
        return 0  # this process's loops are all running: see the module docstring
    try:
        wait_s = float(settings.GPUSHARE_DISPATCH_IDLE_S) if idle_s is None else idle_s
        return _loop(pool, turn_s, wait_s)
    finally:
        loop_seats.give_back()


def _loop(pool: str, turn_s: float, idle_s: float) -> int:
    queue = fair_queue()
    loop = DispatchLoop(token=uuid.uuid4().hex)
    turn_ends = time.monotonic() + turn_s
    ran = 0
    try:
        job = queue.pick(pool, loop=loop)
        while True:
            while job is not None:
                _summon_if_asked(loop, pool)
                job = _run_one(queue, job, pool, loop, turn_ends)
                ran += 1
                _hand_back_database()
            # Nothing to run: the pick registered this loop as idle.
            if _turn_over(turn_ends):
                break
            if not queue.wait_for_work(pool, loop, idle_s, stop=loop_seats.stopping):
                return ran
            if _turn_over(turn_ends):  # woken as the worker stops: another loop runs it
                _summon(pool)
                return ran
            job = queue.pick(pool, loop=loop)
    except BaseException:
        _leave(queue, pool, loop)  # a wake-up must not go to a loop that is gone
        raise
    _leave(queue, pool, loop)
    return ran


def _hand_back_database() -> None:
    """A loop lives for minutes: its thread must not keep a connection of the process's
    database pool meanwhile (a job opens one only for a batch line or an engine lookup), or
    a worker with more loops than the pool has connections makes other tasks wait for one."""
    try:
        connection.close()
    except Exception:  # a broken connection: the pool replaces it
        log.warning("could not hand back the database connection", exc_info=True)


def _turn_over(turn_ends: float) -> bool:
    return loop_seats.stopping.is_set() or time.monotonic() > turn_ends


def _leave(queue: FairQueue, pool: str, loop: DispatchLoop) -> None:
    try:
        woken = queue.stop_waiting(pool, loop)
    except Exception:  # Redis away: the idle entry expires by itself
        log.warning("dispatch loop %s could not leave the idle loops", loop.token, exc_info=True)
        return
    if woken:  # woken while leaving: its work needs a loop
        _summon(pool)


def _run_one(
    queue: FairQueue, job: Job, pool: str, loop: DispatchLoop, turn_ends: float
) -> Job | None:
    """Runs `job`, releases it and (unless the turn is over) picks the next one, which it
    returns; records the job that ran."""
    result = run_picked(queue, job)
    used = (result.prompt_tokens, result.completion_tokens)
    request = wire.loads(job.payload)
    try:
        words = last_words(job, request, result)
    except Exception:  # the job must still be released, and its waiter answered
        log.exception("job %s: no ledger row", job.job_id)
        words = LastWords(event=result.done_event)
    next_job = None
    if _turn_over(turn_ends):
        queue.release(job.job_id, *used, attempt=job.attempt, last_words=words)
        _summon(pool)  # the rest of the pool's work, after whatever waits now
    else:
        next_job = queue.release_and_pick(job, *used, pool=pool, loop=loop, last_words=words)[1]
    try:
        if result.outcome != "requeued":
            settle(job, request, result)
    except Exception:
        if next_job is not None:  # not started: give it back rather than leave it leased
            queue.requeue(next_job.job_id, attempt=next_job.attempt, reason="worker_error")
        raise
    return next_job


def _summon_if_asked(loop: DispatchLoop, pool: str) -> None:
    if loop.summon_next:  # more work waits and no loop is idle: start the next loop
        loop.summon_next = False
        _summon(pool)


def _summon(pool: str) -> None:
    from workers.tasks import dispatch  # the task module imports this one

    dispatch.delay(pool)


def run_picked(queue: FairQueue, job: Job) -> RunResult:
    """Runs a picked job on its engine; the caller releases it (see `run_job`)."""
    engine = _engines.get_or_compute(
        job.engine_id, lambda: Engine.objects.filter(name=job.engine_id).first()
    )
    if engine is None:  # removed while the job waited: give it back for another engine
        queue.requeue(job.job_id, attempt=job.attempt, reason="engine_removed")
        return RunResult(outcome="requeued")
    return run_job(
        queue, job, shared_engine_client(engine), on_engine_lost=lambda: _fail_if_dead(engine)
    )


def _fail_if_dead(engine: Engine) -> None:
    """The job could not reach `engine`: failed now if its process is gone (see
    `engine_check_unreachable`). Not `runner._engine_lost`, which requeues the job."""
    try:
        engine_check_unreachable(name=engine.name)
    except Exception:  # the job goes back to the queue all the same
        log.warning("could not check unreachable engine %s", engine.name, exc_info=True)


def last_words(job: Job, request: dict[str, Any], result: RunResult) -> LastWords:
    """The run's `done` event and its ledger row, told with its release (two round trips
    to Redis fewer per job). A requeued run has neither: its job runs again."""
    if result.outcome == "requeued":
        return LastWords()
    row = wire.dumps(usage_fields(job, request, result))
    return LastWords(event=result.done_event, outbox=USAGE_PENDING_KEY, entry=row)


def settle(job: Job, request: dict[str, Any], result: RunResult) -> None:
    """The run's limits settled to its real tokens and, for a batch line, its answer
    written to the line (its ledger row went with the release)."""
    used = result.prompt_tokens + result.completion_tokens
    admission = request.get("admission")
    if admission:
        try:
            limits_settle(admission=Admission(**admission), used_tokens=used)
        except Exception:  # a missed refund only errs on the strict side
            log.warning("could not settle limits of job %s", job.job_id, exc_info=True)
    if request.get("batch_id"):  # nobody waits on a batch line: its result goes to its batch
        batch_line_finished(
            job_id=job.job_id, request=request, response_body=result.response_body,
            error_body=result.error_body, status_code=result.status_code,
        )  # fmt: skip


def usage_fields(job: Job, request: dict[str, Any], result: RunResult) -> dict[str, Any]:
    received = float(request.get("received_at") or job.enqueued_at)
    ttft = result.first_token_at - received if result.first_token_at else None
    return {
        "request_id": job.job_id,
        "tenant_id": request["tenant_id"],
        "api_key_id": request.get("api_key_id"),
        "model": request["model"],
        "engine": job.engine_id,
        "request_class": job.request_class,
        "batch_id": request.get("batch_id", ""),
        "endpoint": request["endpoint"],
        "outcome": result.outcome,
        "status_code": result.status_code,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "reserved_units": job.kv_bytes / UNIT_BYTES,
        "reserved_unit_seconds": reserved_unit_seconds(job, result),
        "queue_wait_ms": int(max(0.0, result.started_at - received) * 1000),
        "ttft_ms": int(ttft * 1000) if ttft is not None else None,
        "latency_ms": int(max(0.0, result.finished_at - received) * 1000),
        "error_code": result.error_code,
        "finished_at": datetime.fromtimestamp(result.finished_at, tz=UTC).isoformat(),
    }
