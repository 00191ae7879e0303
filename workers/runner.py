"""Running one picked job on its engine, and telling its waiter what happens.

The dispatcher (workers/dispatch.py) asks the fair queue for the fairest admissible job of a
pool (the queue has already reserved its KV memory and leased it to this process), and runs
it here, on its event loop, beside every other job the process holds: the engine's answer is
relayed through the job's event list. The dispatcher then releases the reservation with the
real token counts (together with its next pick). However the job ends, it is released
exactly once: `release` is idempotent, and a job whose lease was lost (cancelled, or reaped
because the process was presumed dead) is not ours to finish any more.

Events the waiter reads (each with the `attempt` it belongs to, so a stale run's words are
ignored after a requeue): ``chunk`` (one streamed chunk from the engine), ``done`` (the
response body when not streaming, and the usage), ``error`` (status and OpenAI-style body),
``grant`` (the waiter streams from the engine itself, see below).

A stream with a waiter is granted, not relayed (GPUSHARE_WEB_STREAMS_FROM_ENGINE): the run
tells the waiter (the web process that holds the client) to call the engine itself, and
waits for its report (`scheduler.online.granted`), holding the job's lease meanwhile. A relayed
token costs a write to Redis, a read from it and a wake-up of two more processes; granted,
the engine's chunks go straight to the process that sends them on. The report says what a
relayed run would have found out itself (the tokens, the engine's refusal, or that the
engine was lost), and the run ends as it would have.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from capacity.units import UNIT_BYTES
from fairqueue.aio import AsyncFairQueue
from fairqueue.domain import Job
from fairqueue.growth import Growth
from fairqueue.inbox import Inboxes, chunk_entry, event_entry
from plumbing import wire
from scheduler.engines.aio_client import AnswerTooLarge, AsyncEngineClient
from scheduler.engines.calls import (
    ResponseEvents,
    cached_tokens,
    client_data,
    engine_body,
    engine_path,
    usage_counts,
)
from scheduler.engines.client import EngineRequestError, EngineUnavailable
from scheduler.online.granted import ALIVE_S, Report
from tracing import spans
from workers import run_trace

log = logging.getLogger(__name__)

# A job whose engine fails this many times is answered with an error, not retried forever.
MAX_ATTEMPTS = 3
# The longest a stream's reading holds the dispatcher's loop before it lets the rest run.
YIELD_EVERY_S = 0.002
# How long a granted run waits without a word from its web (which says it is alive every
# ALIVE_S) before it looks for the web's report in the job and, finding none, gives up.
GRANT_SILENCE_S = 4 * ALIVE_S
# How long a granted run cancelled by its web waits for the web's report of what it used.
CUT_REPORT_S = 3.0


@dataclass
class RunResult:
    """What the ledger needs to know about one run."""

    outcome: str
    status_code: int = 200
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of its prompt tokens, those the engine's prefix cache held
    started_at: float = field(default_factory=time.time)
    first_token_at: float | None = None
    finished_at: float = 0.0
    error_code: str = ""
    # The answer a waiter got: the engine's body (not streamed) or the OpenAI error body.
    # Batch lines are written from these, since nobody waits on them.
    response_body: dict[str, Any] | None = None
    error_body: dict[str, Any] | None = None
    # The run's final `done` event (None unless it ended well): the caller tells it to the
    # waiter in the step that releases the job.
    done_event: dict[str, Any] | None = None


class Run:
    """A job this process runs, as its dispatcher tracks it: `stop` ends its engine call
    (closing the connection makes vLLM abort the request) and says why."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.request: dict[str, Any] = wire.loads(job.payload)
        self.inbox: str = self.request.get("inbox") or ""  # its waiter's (none: a batch line)
        self.chunks = 0  # the chunks relayed to its waiter so far, numbered from 1
        # Why it stopped: "lost" (no longer ours), "worker_stopping", "waiter_gone" (its
        # granted web went silent) or "client_gone" (its granted web's client left).
        self.stopped: str = ""
        self.call: asyncio.Future[None] | None = None
        self.engine_called = False  # the engine has the request (a relayed call was made)
        # Its spans, where tracing is on (workers/run_trace.py).
        self.span: Any = None
        self.dispatch_span: Any = None

    def stop(self, why: str) -> None:
        """Once: a run that is stopping may still wait a moment for its last report."""
        if self.stopped:
            return
        self.stopped = why
        if self.call is not None:
            self.call.cancel()


class Relay:
    """Events for waiters, written to Redis together: every event published while a write is
    under way goes in the next one (each job's in order), so a process whose streams decode
    in step (one chunk each per engine step) writes one round trip per step, not one per
    stream. An event goes to its waiter's inbox (`fairqueue.inbox`), or to the
    job's own list when nobody waits (a batch line). `flush` waits until what was published
    before it is written: a run's final words, told with its release, must come after its
    chunks."""

    def __init__(self, queue: AsyncFairQueue) -> None:
        self._queue = queue
        self._pending: list[tuple[str, str | bytes]] = []
        self._jobs: list[str] = []  # the job of each pending entry
        self._writer: asyncio.Future[None] | None = None
        self._failed: dict[str, BaseException] = {}

    def publish(self, run: Run, event: dict[str, Any]) -> None:
        job = run.job
        raw = wire.dumps({**event, "attempt": job.attempt})
        if run.inbox:
            self._add(job, run.inbox, event_entry(job.job_id, raw))
        else:
            self._add(job, self._queue.keys.events(job.pool, job.job_id), raw)

    def chunk(self, run: Run, data: bytes, chunk: dict[str, Any]) -> None:
        """A streamed chunk: `data` (its JSON as the client gets it) to the inbox, unparsed."""
        job = run.job
        if run.inbox:
            run.chunks += 1
            self._add(job, run.inbox, chunk_entry(job.job_id, job.attempt, data, run.chunks))
        else:
            self.publish(run, {"event": "chunk", "data": chunk})

    def _add(self, job: Job, key: str, entry: str | bytes) -> None:
        self._pending.append((key, entry))
        self._jobs.append(job.job_id)
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._write())

    async def _write(self) -> None:
        try:
            while self._pending:
                batch, jobs, self._pending, self._jobs = self._pending, self._jobs, [], []
                try:
                    await self._queue.publish_many(batch)
                except Exception as exc:  # Redis away: each run whose words were lost hears
                    lost = " ".join(dict.fromkeys(jobs))
                    log.warning("could not relay %d events of jobs %s: %s", len(batch), lost, exc)
                    for job_id in jobs:
                        self._failed[job_id] = exc
        finally:
            self._writer = None

    async def flush(self, job: Job) -> None:
        """Returns once `job`'s events so far are written; raises what stopped them."""
        while self._writer is not None:
            await asyncio.shield(self._writer)
        failed = self._failed.pop(job.job_id, None)
        if failed is not None:
            raise failed


def _openai_error(message: str, code: str, error_type: str = "server_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "code": code, "param": None}}


async def run_job(
    queue: AsyncFairQueue,
    run: Run,
    client: AsyncEngineClient,
    relay: Relay,
    on_engine_lost: Callable[[], Awaitable[None]] | None = None,
    reports: Inboxes | None = None,
    before_call: Callable[[], Awaitable[None]] | None = None,
) -> RunResult:
    """Runs `run`'s job on `client`'s engine; returns what happened (the ledger's row). The
    job is still reserved when this returns, unless it was requeued or given up: the caller
    releases it with the result's token counts, telling its `done_event` in the same step
    (after `relay.flush`). `on_engine_lost` runs when the engine cannot be reached, before the
    job is requeued. A run stopped by its dispatcher ends as "cancelled". With `reports` (the
    process's inbox for webs' reports), a stream with a waiter is granted to it.
    `before_call`: what must be done on the engine first (its adapter loaded); it fails as
    the engine call would."""
    job = run.job
    result = RunResult(outcome="success")
    growth: Growth | None = None
    if reports is not None and (job.answered or grants(run)):
        call = _granted(queue, run, client, relay, reports, result)
    else:
        growth = Growth(queue, job.pool, job.job_id, job.attempt, job.covered_tokens)
        call = _call_engine(run, client, relay, result, growth)
    if before_call is not None:
        call = _after(before_call, call)
    try:
        run.call = asyncio.ensure_future(call)
        if run.stopped:
            run.call.cancel()
        try:
            await run.call
        finally:
            run.call = None
    except asyncio.CancelledError:
        if not run.stopped:
            raise  # the dispatcher itself is being torn down
        result.outcome = "cancelled"
        if growth is not None:
            _charge_cut_short(run, result, growth.tokens)
    except EngineRequestError as exc:
        if isinstance(exc, AnswerTooLarge) and growth is not None:
            _charge_too_large(run, result, growth.tokens)
        _answer_engine_refusal(run, relay, exc, result)
    except EngineUnavailable as exc:
        return await _engine_lost(queue, run, relay, str(exc), result, on_engine_lost)
    except Exception as exc:  # never leave a waiter hanging on a bug
        log.exception("job %s failed", job.job_id)
        result.outcome, result.status_code, result.error_code = "error", 500, "internal_error"
        result.error_body = _openai_error(f"The job failed: {exc}", "internal_error")
        relay.publish(run, {"event": "error", "status": 500, "body": result.error_body})
    result.finished_at = time.time()
    return result


async def _after(first: Callable[[], Awaitable[None]], call: Coroutine[Any, Any, None]) -> None:
    try:
        await first()
    except BaseException:
        call.close()  # never started
        raise
    await call


def _charge_cut_short(run: Run, result: RunResult, pieces: int) -> None:
    """A relayed run stopped before its end (its client left) is charged what the engine did:
    its prompt, prefilled once the call was made, and the pieces streamed so far (a piece is
    a token; a whole answer cut short gave none). The engine's own count stands where it
    gave one; the prompt's reservation (`Job.prompt_tokens`, the engine's count or an upper
    bound of it) stands for the prompt where it did not."""
    if not run.engine_called:
        return
    result.prompt_tokens = result.prompt_tokens or run.job.prompt_tokens
    result.completion_tokens = max(result.completion_tokens, pieces)


def _charge_too_large(run: Run, result: RunResult, pieces: int) -> None:
    """An answer ended for its size: a stream is charged as one cut short; a whole answer
    was generated whole before it came, and is charged every token it could have had."""
    if run.request["stream"]:
        _charge_cut_short(run, result, pieces)
    else:
        result.prompt_tokens = result.prompt_tokens or run.job.prompt_tokens
        result.completion_tokens = max(result.completion_tokens, run.job.max_tokens)


def grants(run: Run) -> bool:
    """Whether the run's waiter streams from the engine itself (see the module docstring)."""
    return bool(run.inbox and run.request["stream"] and settings.GPUSHARE_WEB_STREAMS_FROM_ENGINE)


async def _granted(
    queue: AsyncFairQueue,
    run: Run,
    client: AsyncEngineClient,
    relay: Relay,
    reports: Inboxes,
    result: RunResult,
) -> None:
    """The waiter streams the answer from the engine; this waits for its report and ends as
    a relayed run would have (see `_apply_report`)."""
    job = run.job
    if job.answered:  # its web answered while the job's first worker was dying
        _apply_report(run, Report.parse(job.answered), result)
        return
    inbox = reports.of(job.pool)  # the pool's: the web's answer script appends to it
    words = inbox.register(job.job_id)
    report = Report()
    try:
        grant = {
            "event": "grant", "url": client.base_url, "reply": inbox.key, "stamp": job.stamp,
            "covered": job.covered_tokens,  # the web grows the reservation past it (Growth)
            "engine": job.engine_id,  # the web's log lines about the job name it
        }  # fmt: skip
        relay.publish(run, grant)
        run_trace.dispatched(run)
        while True:
            try:
                async with asyncio.timeout(GRANT_SILENCE_S):
                    report = Report.parse(await words.get())
            except TimeoutError:
                answered = await queue.answered(job.pool, job.job_id)
                if not answered:
                    log.warning("job %s: its web went silent; given up", job.job_id)
                    run.stop("waiter_gone")
                    raise asyncio.CancelledError from None
                report = Report.parse(answered)
            if report.final:
                break
    except asyncio.CancelledError:
        if run.stopped == "lost":  # cancelled by its web, whose report says what was used
            report = await _last_report(words) or report
            _count_report(run, report, result)
        raise
    finally:
        inbox.unregister(job.job_id)
    _apply_report(run, report, result)


async def _last_report(words: asyncio.Queue[bytes]) -> Report | None:
    """The final report of a granted call whose client left, as its web sends it after the
    job's cancel (or before: then it is waiting already); None after CUT_REPORT_S."""
    reading = asyncio.ensure_future(_final_report(words))
    done, _ = await asyncio.wait({reading}, timeout=CUT_REPORT_S)
    if not done:
        reading.cancel()
        return None
    return reading.result()


async def _final_report(words: asyncio.Queue[bytes]) -> Report:
    while True:
        report = Report.parse(await words.get())
        if report.final:
            return report


def _count_report(run: Run, report: Report, result: RunResult) -> None:
    """The tokens a granted call used, as its web reports them. A call its client cut short
    is charged what the engine did: its prompt (the engine's count, else the reservation's,
    see `_charge_cut_short`) and the pieces streamed."""
    if report.first_token_at:
        result.first_token_at = report.first_token_at
    result.prompt_tokens, result.completion_tokens = report.prompt_tokens, report.completion_tokens
    result.cached_tokens = report.cached_tokens
    if report.cut_short:
        result.prompt_tokens = result.prompt_tokens or run.job.prompt_tokens


def _apply_report(run: Run, report: Report, result: RunResult) -> None:
    _count_report(run, report, result)
    if report.outcome == "cancelled":  # its client left: released with what it used
        run.stopped = run.stopped or "client_gone"
        raise asyncio.CancelledError
    if report.outcome == "engine_lost":
        raise EngineUnavailable(report.detail)
    if report.outcome == "refused" and report.cut_short:
        raise AnswerTooLarge(int(settings.GPUSHARE_MAX_ANSWER_BYTES))
    if report.outcome == "refused":
        raise EngineRequestError(
            f"the engine answered {report.status_code}",
            status_code=report.status_code,
            body=report.detail,
        )
    # The waiter told its client the end itself: no `done` event for it.


async def _call_engine(
    run: Run, client: AsyncEngineClient, relay: Relay, result: RunResult, growth: Growth
) -> None:
    span = run_trace.engine_call(run, client.base_url)
    try:
        await _engine_call(run, client, relay, result, growth, spans.headers(span))
    except BaseException as exc:
        run_trace.engine_call_ended(span, result, error=f"{exc.__class__.__name__}: {exc}"[:200])
        raise
    run_trace.engine_call_ended(span, result)


async def _engine_call(
    run: Run,
    client: AsyncEngineClient,
    relay: Relay,
    result: RunResult,
    growth: Growth,
    headers: dict[str, str] | None,
) -> None:
    job, request = run.job, run.request
    path, body = engine_path(request), engine_body(request, job.request_class, job.stamp)
    run.engine_called = True
    run_trace.dispatched(run)
    if not request["stream"]:
        response = await client.generate(path, body, headers)
        result.first_token_at = time.time()
        _count_usage(result, response.get("usage"))
        result.response_body = response
        result.done_event = {
            "event": "done", "body": response, "usage": _usage(result), "attempt": job.attempt
        }  # fmt: skip
        return
    try:
        if request["endpoint"] == "responses":
            await _relay_events(run, client.events(path, body, headers), relay, result, growth)
        else:
            await _relay_chunks(run, client.stream(path, body, headers), relay, result, growth)
    finally:
        growth.close()


async def _relay_chunks(
    run: Run,
    chunks: AsyncIterator[bytes],
    relay: Relay,
    result: RunResult,
    growth: Growth,
) -> None:
    request = run.request
    finished = False
    include_usage = bool(request.get("include_usage"))
    loop = asyncio.get_running_loop()
    yielded_at = loop.time()
    async for data in chunks:
        chunk = wire.loads(data)
        choices = chunk.get("choices") or []
        if result.first_token_at is None and choices:
            result.first_token_at = time.time()
        growth.add(len(choices))
        finished = finished or any(choice.get("finish_reason") for choice in choices)
        _count_usage(result, chunk.get("usage"))
        passed_on = client_data(data, chunk, include_usage)
        if passed_on is not None:
            relay.chunk(run, passed_on, chunk)
        if loop.time() - yielded_at >= YIELD_EVERY_S:
            # Chunks the engine already sent are read without waiting: without this, a fast
            # stream would hold the loop to its end, its chunks unrelayed and every other run,
            # pick and cancel check of the process waiting behind it.
            await asyncio.sleep(0)
            yielded_at = loop.time()
    if not finished:
        # An engine whose core died can still end the stream with [DONE] (seen when the
        # engine was killed mid-stream): without a finish reason, the answer is cut short.
        raise EngineUnavailable("the engine's stream ended without a finish reason")
    result.done_event = _stream_done(run, result)


async def _relay_events(
    run: Run,
    events: AsyncIterator[tuple[bytes, bytes]],
    relay: Relay,
    result: RunResult,
    growth: Growth,
) -> None:
    """A Responses stream: each event relayed as the engine wrote it (`event:` line and all),
    its usage read from its last (`scheduler.engines.calls.ResponseEvents`)."""
    reading = ResponseEvents()
    loop = asyncio.get_running_loop()
    yielded_at = loop.time()
    async for frame, data in events:
        event = reading.read(data)
        if result.first_token_at is None and reading.first_output:
            result.first_token_at = time.time()
        growth.add(reading.is_delta(event))
        relay.chunk(run, frame, event)
        if loop.time() - yielded_at >= YIELD_EVERY_S:  # as `_call_engine` does, and why
            await asyncio.sleep(0)
            yielded_at = loop.time()
    if not reading.ended:
        raise EngineUnavailable("the engine's stream ended before its last event")
    result.prompt_tokens, result.completion_tokens = reading.counts
    result.cached_tokens = reading.cached
    result.done_event = _stream_done(run, result)


def _stream_done(run: Run, result: RunResult) -> dict[str, Any]:
    """A relayed stream's last word, with the chunks its waiter should have had."""
    done = {"event": "done", "usage": _usage(result), "attempt": run.job.attempt}
    if run.inbox:
        done["chunks"] = run.chunks
    return done


def _count_usage(result: RunResult, usage: dict[str, Any] | None) -> None:
    counts = usage_counts(usage)
    if counts is not None:
        result.prompt_tokens, result.completion_tokens = counts
        result.cached_tokens = cached_tokens(usage)


def _usage(result: RunResult) -> dict[str, int]:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


def _answer_engine_refusal(
    run: Run, relay: Relay, exc: EngineRequestError, result: RunResult
) -> None:
    """The engine refused the request itself (a 4xx): the client's to fix; pass it on."""
    try:
        body = json.loads(exc.body)
        message = body.get("message") or body.get("error", {}).get("message") or exc.body
    except (ValueError, AttributeError):
        message = exc.body
    code = "answer_too_large" if isinstance(exc, AnswerTooLarge) else "invalid_request"
    result.outcome, result.status_code = "error", exc.status_code
    result.error_code = "answer_too_large" if isinstance(exc, AnswerTooLarge) else "engine_400"
    error = _openai_error(str(message)[:2000], code, "invalid_request_error")
    result.error_body = error
    relay.publish(run, {"event": "error", "status": exc.status_code, "body": error})


async def _engine_lost(
    queue: AsyncFairQueue,
    run: Run,
    relay: Relay,
    detail: str,
    result: RunResult,
    on_engine_lost: Callable[[], Awaitable[None]] | None,
) -> RunResult:
    """The engine could not be reached or crashed mid-request: try another run, a few times."""
    job = run.job
    log.warning("job %s: engine %s unavailable: %s", job.job_id, job.engine_id, detail)
    if on_engine_lost is not None:  # first: the job's next pick must not find a dead engine
        await on_engine_lost()
    result.finished_at = time.time()
    await relay.flush(job)  # the chunks it sent come before the requeue's notice
    if job.attempt < MAX_ATTEMPTS and await queue.requeue(job, "engine_unavailable"):
        result.outcome = "requeued"
        return result
    result.outcome, result.status_code, result.error_code = "error", 503, "engine_unavailable"
    result.error_body = _openai_error(
        "The model's engine failed while running this request; please retry.",
        "engine_unavailable",
    )
    relay.publish(run, {"event": "error", "status": 503, "body": result.error_body})
    return result


def reserved_unit_seconds(job: Job, result: RunResult) -> float:
    """The KV its engine reserved for it when picked (its worst case, or a prediction) by
    the time it ran."""
    reserved = job.reserved or job.kv_bytes
    return reserved / UNIT_BYTES * max(0.0, result.finished_at - result.started_at)
