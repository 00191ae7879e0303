"""A worker process's dispatcher: it keeps its engines' batches full from the fair queue.

Requests wait in the fair queue, and nowhere else but in an engine's own short queue of
picked requests (EnginePolicy.queued). Each worker process runs one event loop in a thread of
its own (the dispatcher), which holds every engine call the process makes, as many at once
as the queue lets it pick: the queue admits a job only while its engine has a seat
(`max_num_seqs`) or a place in its queue, room in its KV budget, and its tenant room in its
quota. A thread per call would cap the calls at the thread count, far under a GPU engine's
batch.

For each pool it serves, the dispatcher runs a picker: it picks until the queue says nothing
may run now, starting each job as a task of its own; then it waits for a wake-up in Redis
(`GPUSHARE_DISPATCH_IDLE_S`, a minute) and ends if none comes. New work and freed seats wake
a waiting picker through Redis (the enqueue, release and cancel scripts), without a Celery
message: a message costs the sender, the worker and Redis several ms of CPU. A job that ends
releases its reservation and picks the pool's next job for the engine it ran on (where the
room appeared: one engine read, however many the pool has) in one script call, and runs it
in the same task. Only when no picker of the pool waits does the web send a `dispatch` task
(once per burst); it starts the pool's picker in the process that takes it (or nudges the
one already there), and a picker that starts summons the next while more work waits and no
picker is idle (fan-out over processes). Housekeeping wakes or summons a picker for pools
that still have waiting work, in case a wake-up or a message was lost.

One watcher per process renews the leases of every job it runs (one round trip for all)
and looks every `WATCH_S` whether each is still its own: a job cancelled (its client left)
or reaped is stopped at once, and the engine aborts it when its connection closes.

On a warm shutdown the pickers stop, running jobs get `GPUSHARE_WORKER_DRAIN_S` to finish,
and the rest go back to the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import redis
from celery.signals import worker_shutting_down
from django.conf import settings
from django.core.exceptions import SynchronousOnlyOperation
from django.db import connection

from capacity.units import UNIT_BYTES
from fairqueue.aio import AsyncFairQueue
from fairqueue.domain import DispatchLoop, Job
from fairqueue.inbox import Inboxes
from fairqueue.queue import FairQueue, LastWords
from plumbing import request_ids, wire
from plumbing.aio_redis import Arg
from plumbing.change_marks import cache_by_marks
from plumbing.redis import async_client
from plumbing.ttlcache import TtlCache
from scheduler import worker_tasks
from scheduler.adapters.loading import AdapterLoads
from scheduler.adapters.selectors import adapter_get
from scheduler.adapters.storage import local_dir
from scheduler.batches.feeder import batch_line_finished
from scheduler.engines.aio_client import AsyncEngineClient
from scheduler.engines.auth import engine_api_key
from scheduler.engines.client import EngineRequestError
from scheduler.models import Engine
from scheduler.pools.policies import engine_changes, fair_queue
from telemetry.rejections import UNRESERVED_KEY
from tenants.limits import Admission, settlements
from tenants.usage_buffer import end_user
from tenants.usage_buffer import outbox as usage_outbox
from workers import run_trace
from workers.runner import Relay, Run, RunResult, reserved_unit_seconds, run_job

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# Engines by name, for their address: a moved or removed engine is seen within the TTL (and a
# job picked for an engine that is gone is given back to its queue). Read again only after an
# engine's row was saved (its change mark), or every GPUSHARE_CHANGE_RECHECK_S.
_engines: TtlCache[Engine | None] = cache_by_marks(5.0, engine_changes)
# How often the watcher looks whether each running job is still this process's.
WATCH_S = 0.5
# Connections to Redis the dispatcher's loop may hold: the pickers' waits, the watcher's and
# the relay's writes, and the runs' releases.
REDIS_CONNECTIONS = 64
REDIS_READ_TIMEOUT_S = 60.0


class Dispatcher:
    """The process's engine calls, on one event loop in a thread of its own (started by the
    first `ensure`). Its methods without `async` may be called from any thread."""

    def __init__(self, queue: Callable[[], FairQueue] = fair_queue) -> None:
        self._make_queue = queue
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pickers: dict[str, _Picker] = {}
        self.runs: dict[str, Run] = {}
        self._tasks: set[asyncio.Future[Any]] = set()
        self._watcher: asyncio.Future[Any] | None = None
        self._room = asyncio.Event()  # set while the process may take more runs
        self._stopping = asyncio.Event()
        self._queue: AsyncFairQueue | None = None
        self._relay: Relay | None = None
        self._reports: Inboxes | None = None
        self._adapter_loads: AdapterLoads | None = None
        self._engine_clients: dict[str, AsyncEngineClient] = {}
        self._db = ThreadPoolExecutor(max_workers=4, thread_name_prefix="dispatch-db")
        self.ran = 0  # jobs whose run ended, since the process started

    # --- from any thread -----------------------------------------------------------------

    def ensure(self, pool: str) -> None:
        """The pool's picker runs in this process: started, or nudged to pick again."""
        loop = self._started()
        loop.call_soon_threadsafe(self._ensure_picker, pool)

    def run_soon(self, work: Callable[[Dispatcher], Awaitable[_T]]) -> Future[_T]:
        """`work(self)` on the dispatcher's loop, started now; its result through the
        future (for callers on other threads: tests, shells)."""
        return asyncio.run_coroutine_threadsafe(_awaited(work(self)), self._started())

    def stop(self, drain_s: float) -> None:
        """Stops picking; running jobs get `drain_s` to finish, the rest go back to the
        queue. Returns once the loop has stopped."""
        with self._lock:
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        done = asyncio.run_coroutine_threadsafe(self._shut_down(drain_s), loop)
        with contextlib.suppress(Exception):
            done.result(timeout=drain_s + 30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        with self._lock:
            self._loop = self._thread = None

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is not None and self._thread is not None and self._thread.is_alive():
                return self._loop
            ready = threading.Event()
            self._thread = threading.Thread(
                target=self._serve, args=(ready,), name="dispatcher", daemon=True
            )
            self._thread.start()
            ready.wait()
            assert self._loop is not None
            return self._loop

    def _serve(self, ready: threading.Event) -> None:
        loop = _new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        self._room, self._stopping = asyncio.Event(), asyncio.Event()
        self._room.set()
        queue = self._make_queue()
        client = async_client(
            max_connections=REDIS_CONNECTIONS,
            read_timeout_s=REDIS_READ_TIMEOUT_S,
        )
        self._queue = AsyncFairQueue(queue, client)
        self._relay = Relay(self._queue)
        # What webs report of the streams this process granted them (workers/runner.py).
        self._reports = Inboxes(client, self._queue.keys, f"worker-{uuid.uuid4().hex}")
        self._adapter_loads = AdapterLoads(client, self._adapter_dir)
        self._pickers, self.runs, self._engine_clients = {}, {}, {}
        self._watcher = self._spawn(self._watch())
        ready.set()
        try:
            loop.run_forever()
        finally:
            client.close()
            loop.close()

    # --- on the loop ---------------------------------------------------------------------

    def _spawn(self, work: Any) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("dispatcher task failed", exc_info=task.exception())

    def _ensure_picker(self, pool: str) -> None:
        if self._stopping.is_set():
            return
        picker = self._pickers.get(pool)
        if picker is not None and not picker.task.done():
            picker.nudge()
            return
        self._pickers[pool] = _Picker(self, pool)

    async def _shut_down(self, drain_s: float) -> None:
        self._stopping.set()
        for picker in list(self._pickers.values()):
            picker.nudge()
        ends = time.monotonic() + drain_s
        while self.runs and time.monotonic() < ends:
            await asyncio.sleep(0.1)
        for run in list(self.runs.values()):
            run.stop("worker_stopping")
        if self._watcher is not None:
            self._watcher.cancel()
        for picker in list(self._pickers.values()):
            picker.task.cancel()  # a wait for a wake-up ends now, not at its slice's end
        ends = time.monotonic() + 10
        while self._tasks and time.monotonic() < ends:
            await asyncio.sleep(0.02)
        await self.flush_settlements()
        for client in self._engine_clients.values():
            await client.close()
        await self.reports.close()

    def take_run(self, job: Job) -> Run:
        run = self.runs[job.job_id] = Run(job)
        run_trace.begin(run)
        self._room_changed()
        return run

    def _end_run(self, job: Job) -> None:
        self.runs.pop(job.job_id, None)
        self.ran += 1
        self._room_changed()

    def _room_changed(self) -> None:
        if len(self.runs) < int(settings.GPUSHARE_WORKER_MAX_RUNS):
            self._room.set()
        else:
            self._room.clear()

    async def chain(self, job: Job | None, pool: str) -> None:
        """Runs `job`, then the pool's next job picked with its release, until none may
        run now or the process stops."""
        queue, relay = self.queue, self.relay
        while job is not None:
            run = self.take_run(job)
            request_ids.bind(request_id=job.job_id, tenant=job.tenant, engine=job.engine_id)
            next_job, result = None, None
            try:
                result = await run_picked(self, run)
                await relay.flush(job)
                if run.stopped == "worker_stopping":
                    await queue.requeue(job, "worker_stopping")
                    continue
                if result.outcome == "requeued":  # given back already: nothing to release
                    continue
                words = _last_words_or_none(job, run.request, result)
                used = (result.prompt_tokens, result.completion_tokens)
                if self._stopping.is_set():
                    await queue.release(job, *used, last_words=words)
                else:
                    _, next_job = await queue.release_and_pick(
                        job, *used, pool=pool, last_words=words
                    )
                    if next_job is not None and next_job.engine_id != job.engine_id:
                        # It went to the engine that holds its prefix: the seat freed here
                        # is still free, and the pool's picker fills it if work waits.
                        self._ensure_picker(pool)
            finally:
                self._end_run(job)
                run_trace.end(run, result)
                job = None
            await self.settle(run, result)
            job = next_job

    async def settle(self, run: Run, result: RunResult) -> None:
        """What a run leaves in the database and the limits, off the loop, where it has any
        (a batch line's answer; a counted request's limits)."""
        await self.note_unreserved(run.job, result)
        request = run.request
        if not (request.get("batch_id") or (request.get("admission") or {}).get("counted")):
            return
        try:
            await self.in_thread(settle, run.job, request, result)
        except Exception:  # a batch line's answer is taken from its events by the feeder
            log.exception("job %s: could not settle", run.job.job_id)

    async def flush_settlements(self) -> None:
        """The limits' settlements of the runs that ended since the last flush (`settle`),
        written together: one round trip per WATCH_S, not one per run."""
        if not settlements.pending:
            return
        try:
            await self.in_thread(settlements.flush)
        except Exception:  # a missed refund only errs on the strict side
            log.warning("could not settle the limits of the runs that ended", exc_info=True)

    async def note_unreserved(self, job: Job, result: RunResult) -> None:
        """A prompt the engine counted longer than its reservation: the KV reserved and the
        quota fell short of it. Never expected (the bounds are upper bounds); logged and
        counted by tenant (gpushare_unreserved_prompt_tokens_total) where it happens."""
        gap = result.prompt_tokens - job.prompt_tokens
        if gap <= 0:
            return
        log.warning(
            "job %s of tenant %s: the engine counted %d prompt tokens, %d more than reserved",
            job.job_id, job.tenant, result.prompt_tokens, gap,
        )  # fmt: skip
        with contextlib.suppress(redis.RedisError):  # the warning above stands for it
            await self.queue.redis.call("HINCRBY", UNRESERVED_KEY, job.tenant, gap)

    async def in_thread(self, work: Callable[..., _T], *args: Any) -> _T:
        """Synchronous work (the database, Celery's client) in a thread, never on the loop;
        the thread hands its database connection back when done."""

        def call() -> _T:
            try:
                return work(*args)
            finally:
                connection.close()

        return await asyncio.get_running_loop().run_in_executor(self._db, call)

    def summon(self, pool: str) -> None:
        from workers.tasks import dispatch  # the task module imports this one

        self._spawn(self.in_thread(dispatch.delay, pool))

    def engine_client(self, engine: Engine) -> AsyncEngineClient:
        client = self._engine_clients.get(engine.base_url)
        if client is None:
            client = self._engine_clients[engine.base_url] = AsyncEngineClient(
                engine.base_url,
                api_key=engine_api_key(engine.base_url),
                connect_timeout_s=float(settings.GPUSHARE_ENGINE_HTTP_TIMEOUT_S),
                generate_timeout_s=float(settings.GPUSHARE_ENGINE_GENERATE_TIMEOUT_S),
                max_answer_bytes=int(settings.GPUSHARE_MAX_ANSWER_BYTES),
            )
        return client

    async def engine_of(self, job: Job) -> Engine | None:
        def lookup() -> Engine | None:
            return _engines.get_or_compute(
                job.engine_id, lambda: Engine.objects.filter(name=job.engine_id).first()
            )

        try:
            return lookup()
        except SynchronousOnlyOperation:  # the entry needs the database: a thread reads it
            return await self.in_thread(lookup)

    async def _watch(self) -> None:
        """Renews the leases of this process's runs (every lease / 3) and stops those that
        are no longer its own (every WATCH_S), one round trip each for all runs."""
        queue = self.queue
        renew_every = max(0.5, queue.config.lease_s / 3)
        renewed_at = time.monotonic()
        while True:
            await asyncio.sleep(WATCH_S)
            await self.flush_settlements()
            runs = list(self.runs.values())
            if not runs:
                renewed_at = time.monotonic()
                continue
            jobs = [run.job for run in runs]
            try:
                if time.monotonic() - renewed_at >= renew_every:
                    renewed_at = time.monotonic()
                    ours = await queue.renew_leases(jobs)
                else:
                    ours = await queue.jobs_still_running(jobs)
            except Exception as exc:  # Redis briefly away: try again until leases run out
                log.warning("could not watch %d runs: %s", len(runs), exc)
                continue
            for run, still_ours in zip(runs, ours, strict=True):
                if not still_ours and run.job.job_id in self.runs:
                    run.stop("lost")

    @property
    def adapter_loads(self) -> AdapterLoads:
        assert self._adapter_loads is not None
        return self._adapter_loads

    async def _adapter_dir(self, name: str) -> Path:
        return await self.in_thread(_adapter_local_dir, name)

    @property
    def queue(self) -> AsyncFairQueue:
        assert self._queue is not None
        return self._queue

    @property
    def relay(self) -> Relay:
        assert self._relay is not None
        return self._relay

    @property
    def reports(self) -> Inboxes:
        assert self._reports is not None
        return self._reports

    @property
    def stopping(self) -> asyncio.Event:
        return self._stopping

    @property
    def room(self) -> asyncio.Event:
        return self._room


_REDIS_PAUSE_S, _REDIS_PAUSE_MAX_S = 0.1, 2.0  # a picker's waits after a failed pick


class _Picker:
    """Picks a pool's jobs while the queue admits them; waits for a wake-up when it does
    not; ends after `GPUSHARE_DISPATCH_IDLE_S` without one."""

    def __init__(self, dispatcher: Dispatcher, pool: str) -> None:
        self.dispatcher, self.pool = dispatcher, pool
        self.loop = DispatchLoop(token=uuid.uuid4().hex)
        self.task = dispatcher._spawn(self._run())

    def nudge(self) -> None:
        """A summons reached a picker already running: it picks again now (and clears the
        summons, as a starting picker does)."""
        self.loop.starting = True
        queue = self.dispatcher.queue
        wake = queue.keys.loop_wake(self.pool, self.loop.token)
        commands: list[tuple[Arg, ...]] = [("RPUSH", wake, "1"), ("EXPIRE", wake, 60)]
        self.dispatcher._spawn(queue.redis.pipeline(commands))

    async def _run(self) -> None:
        dispatcher, queue = self.dispatcher, self.dispatcher.queue
        idle_s = float(settings.GPUSHARE_DISPATCH_IDLE_S)
        pause = _REDIS_PAUSE_S
        try:
            while not dispatcher.stopping.is_set():
                await dispatcher.room.wait()
                if dispatcher.stopping.is_set():
                    break
                try:
                    job = await queue.pick(self.pool, loop=self.loop)
                    if job is None:  # nothing may run now: the pick registered it idle
                        if not await queue.wait_for_work(
                            self.pool, self.loop, idle_s, dispatcher.stopping
                        ):
                            return
                        continue
                except redis.RedisError as exc:
                    # Redis away, failing over, or short of replicas (a pick it did not
                    # acknowledge was given back): the pool's work waits in Redis, and this
                    # picker tries again rather than leave the pool without one.
                    log.warning("pool %s: pick failed (%s); trying again in %.1fs",
                                self.pool, exc, pause)  # fmt: skip
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(dispatcher.stopping.wait(), pause)
                    pause = min(2 * pause, _REDIS_PAUSE_MAX_S)
                    continue
                pause = _REDIS_PAUSE_S
                if self.loop.summon_next:  # more work waits and no picker is idle
                    self.loop.summon_next = False
                    dispatcher.summon(self.pool)
                dispatcher._spawn(dispatcher.chain(job, self.pool))
        finally:
            with contextlib.suppress(Exception):
                if await queue.stop_waiting(self.pool, self.loop):
                    dispatcher.summon(self.pool)  # woken while leaving: its work needs one
            if dispatcher._pickers.get(self.pool) is self:
                del dispatcher._pickers[self.pool]


async def _awaited(work: Awaitable[_T]) -> _T:
    return await work


def _new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


dispatcher = Dispatcher()


@worker_shutting_down.connect
def _stop_dispatcher(**_: Any) -> None:
    dispatcher.stop(float(settings.GPUSHARE_WORKER_DRAIN_S))


def dispatch_pool(pool: str) -> None:
    """The `dispatch` task: the pool's picker runs in this process (see the module
    docstring). Returns at once: the calls run on the dispatcher's loop."""
    dispatcher.ensure(pool)


async def run_picked(dispatcher: Dispatcher, run: Run) -> RunResult:
    """Runs a picked job on its engine; the caller releases it (see `run_job`)."""
    job, queue = run.job, dispatcher.queue
    engine = await dispatcher.engine_of(job)
    if engine is None:  # removed while the job waited: give it back for another engine
        await queue.requeue(job, "engine_removed")
        return RunResult(outcome="requeued")

    async def engine_lost() -> None:
        await dispatcher.in_thread(_fail_if_dead, engine)

    client = dispatcher.engine_client(engine)
    adapter = run.request.get("adapter") or ""

    async def load_adapter() -> None:
        if not engine.max_loras:
            message = (
                f"The model '{adapter}' cannot run on engine {engine.name}: it serves no adapters."
            )
            raise EngineRequestError(
                message, status_code=404, body=wire.dumps({"message": message})
            )
        await dispatcher.adapter_loads.ensure(engine, client, adapter)

    result = await run_job(
        queue, run, client, dispatcher.relay, on_engine_lost=engine_lost,
        reports=dispatcher.reports, before_call=load_adapter if adapter else None,
    )  # fmt: skip
    if adapter and result.status_code == 404:
        # The engine did not know it (restarted behind the platform's back): the next job
        # for it loads it again.
        await dispatcher.adapter_loads.forget(engine, adapter)
    return result


def _adapter_local_dir(name: str) -> Path:
    """The adapter's folder on this node; a removed adapter's name is refused by the engine
    as any unknown model is."""
    adapter = adapter_get(name=name)
    if adapter is None:
        message = f"The model '{name}' does not exist."
        raise EngineRequestError(message, status_code=404, body=wire.dumps({"message": message}))
    return local_dir(adapter)


def _fail_if_dead(engine: Engine) -> None:
    """The job could not reach `engine`: its node's engine agent fails it at once if its
    process is gone (see `engine_check_unreachable`); this process cannot see it."""
    try:
        node = Engine.objects.filter(pk=engine.pk).values_list("device__node", flat=True).first()
        if node is not None:
            worker_tasks.engine_check_unreachable(engine.name, node)
    except Exception:  # the job goes back to the queue all the same
        log.warning("could not check unreachable engine %s", engine.name, exc_info=True)


def _last_words_or_none(job: Job, request: dict[str, Any], result: RunResult) -> LastWords:
    try:
        return last_words(job, request, result)
    except Exception:  # the job must still be released, and its waiter answered
        log.exception("job %s: no ledger row", job.job_id)
        return LastWords(event=result.done_event, ttft_s=time_to_first_token(job, request, result))


def last_words(job: Job, request: dict[str, Any], result: RunResult) -> LastWords:
    """The run's `done` event and its ledger row, told with its release (two round trips
    to Redis fewer per job). A requeued run has neither: its job runs again."""
    if result.outcome == "requeued":
        return LastWords()
    row = wire.dumps(usage_fields(job, request, result))
    return LastWords(
        event=result.done_event, outbox=usage_outbox(job.pool), entry=row,
        ttft_s=time_to_first_token(job, request, result),
    )  # fmt: skip


def time_to_first_token(job: Job, request: dict[str, Any], result: RunResult) -> float | None:
    """Seconds from the request's arrival to its first token (to its whole answer when not
    streamed: what its client waited); None when it gave none."""
    if not result.first_token_at:
        return None
    return max(0.0, result.first_token_at - float(request.get("received_at") or job.enqueued_at))


def settle(job: Job, request: dict[str, Any], result: RunResult) -> None:
    """The run's limits settled to its real tokens (its minute counters with the process's
    next flush of its settlements) and, for a batch line, its answer written to the line
    (its ledger row went with the release)."""
    used = result.prompt_tokens + result.completion_tokens
    admission = request.get("admission")
    if admission:
        try:
            settlements.add(
                admission=Admission(**admission), used_tokens=used, request_id=job.job_id
            )
        except Exception:  # a missed refund only errs on the strict side
            log.warning("could not settle limits of job %s", job.job_id, exc_info=True)
    if request.get("batch_id"):  # nobody waits on a batch line: its result goes to its batch
        batch_line_finished(
            pool=job.pool, job_id=job.job_id, request=request, response_body=result.response_body,
            error_body=result.error_body, status_code=result.status_code,
        )  # fmt: skip


def usage_fields(job: Job, request: dict[str, Any], result: RunResult) -> dict[str, Any]:
    received = float(request.get("received_at") or job.enqueued_at)
    ttft = time_to_first_token(job, request, result)
    return {
        "request_id": job.job_id,
        "tenant_id": request["tenant_id"],
        "api_key_id": request.get("api_key_id"),
        "model": request["model"],
        "engine": job.engine_id,
        "request_class": job.request_class,
        "batch_id": request.get("batch_id", ""),
        "endpoint": request["endpoint"],
        "end_user": end_user(request.get("body", {})),
        "outcome": result.outcome,
        "status_code": result.status_code,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "cached_tokens": result.cached_tokens,
        "reserved_units": job.kv_bytes / UNIT_BYTES,
        "reserved_unit_seconds": reserved_unit_seconds(job, result),
        "queue_wait_ms": int(max(0.0, result.started_at - received) * 1000),
        "ttft_ms": int(ttft * 1000) if ttft is not None else None,
        "latency_ms": int(max(0.0, result.finished_at - received) * 1000),
        "error_code": result.error_code,
        "finished_at": datetime.fromtimestamp(result.finished_at, tz=UTC).isoformat(),
    }
