"""Running one picked job on its engine, and telling its waiter what happens.

A worker thread asks the fair queue for the fairest admissible job of a pool (the queue has
already reserved its KV memory and leased it to us), runs it against the engine it was picked
for and relays what the engine says through the job's event list. The caller then releases
the reservation with the real token counts (the dispatch loop does it together with its next
pick). However the job ends, it is released exactly once: `release` is idempotent, and a job
whose lease we lost (we were too slow, or it was cancelled) is not ours to finish any more.

Events the waiter reads (each with the `attempt` it belongs to, so a stale run's words are
ignored after a requeue): ``chunk`` (one streamed chunk from the engine), ``done`` (the
response body when not streaming, and the usage), ``error`` (status and OpenAI-style body).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from config import wire
from scheduler.engines.client import EngineClient, EngineRequestError, EngineUnavailable
from scheduler.fairqueue.domain import Job
from scheduler.fairqueue.queue import FairQueue
from scheduler.units import UNIT_BYTES

log = logging.getLogger(__name__)

# How often a streaming run looks whether its job was cancelled (client gone): the engine
# keeps generating for nobody until then.
CANCEL_CHECK_S = 0.25
# A job whose engine fails this many times is answered with an error, not retried forever.
MAX_ATTEMPTS = 3


@dataclass
class RunResult:
    """What the ledger needs to know about one run."""

    outcome: str
    status_code: int = 200
    prompt_tokens: int = 0
    completion_tokens: int = 0
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


class _Renewals:
    """One thread per process renews the leases of every job its threads run (a thread per
    job would cost a thread start for each), each a third of its lease after the last. A job
    whose lease cannot be renewed any more (cancelled, or reaped because we were presumed
    dead) gets its `lost` flag set."""

    TICK_S = 0.5

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # job id -> (queue, job, lost flag, when its lease is due for renewal)
        self._leases: dict[str, tuple[FairQueue, Job, threading.Event, float]] = {}
        self._thread: threading.Thread | None = None

    def add(self, queue: FairQueue, job: Job, lost: threading.Event) -> None:
        with self._lock:
            self._leases[job.job_id] = (queue, job, lost, self._due(queue))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="lease-renewals", daemon=True
                )
                self._thread.start()

    def remove(self, job_id: str) -> None:
        with self._lock:
            self._leases.pop(job_id, None)

    @staticmethod
    def _due(queue: FairQueue) -> float:
        return time.monotonic() + max(0.5, queue.config.lease_s / 3)

    def _run(self) -> None:
        while True:
            time.sleep(self.TICK_S)
            now = time.monotonic()
            with self._lock:
                due = [lease for lease in self._leases.values() if lease[3] <= now]
            for queue, job, lost, _ in due:
                self._renew(queue, job, lost)

    def _renew(self, queue: FairQueue, job: Job, lost: threading.Event) -> None:
        try:
            still_leased = queue.renew_lease(job.job_id, job.attempt)
        except Exception:  # Redis briefly away: keep trying until the lease runs out
            log.warning("could not renew the lease of job %s", job.job_id, exc_info=True)
            return
        with self._lock:
            if job.job_id not in self._leases:
                return  # the job ended meanwhile
            if still_leased:
                self._leases[job.job_id] = (queue, job, lost, self._due(queue))
            else:
                lost.set()
                del self._leases[job.job_id]


_renewals = _Renewals()


class LeaseKeeper:
    """Keeps the job's lease renewed while it runs; `lost` tells the runner to stop (the job
    was cancelled, or reaped because we were presumed dead)."""

    def __init__(self, queue: FairQueue, job: Job) -> None:
        self._queue, self._job = queue, job
        self.lost = threading.Event()
        _renewals.add(queue, job, self.lost)

    def still_ours(self) -> bool:
        if self.lost.is_set():
            return False
        return self._queue.job_state(self._job.job_id) == ("running", self._job.attempt)

    def stop(self) -> None:
        _renewals.remove(self._job.job_id)


def _openai_error(message: str, code: str, error_type: str = "server_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "code": code, "param": None}}


def run_job(
    queue: FairQueue,
    job: Job,
    client: EngineClient,
    on_engine_lost: Callable[[], None] | None = None,
) -> RunResult:
    """Runs `job` on `client`'s engine; returns what happened (the ledger's row). The job is
    still reserved when this returns, unless it was requeued or given up: the caller
    releases it with the result's token counts, telling its `done_event` in the same step.
    `on_engine_lost` runs when the engine cannot be reached, before the job is requeued."""
    request = wire.loads(job.payload)
    keeper = LeaseKeeper(queue, job)
    result = RunResult(outcome="success")
    try:
        if request["stream"]:
            _run_streaming(queue, job, client, request, keeper, result)
        else:
            _run_whole(job, client, request, result)
    except EngineRequestError as exc:
        _answer_engine_refusal(queue, job, exc, result)
    except EngineUnavailable as exc:
        keeper.stop()
        return _engine_lost(queue, job, str(exc), result, on_engine_lost)
    except Exception as exc:  # never leave a waiter hanging on a bug
        log.exception("job %s failed", job.job_id)
        result.outcome, result.status_code, result.error_code = "error", 500, "internal_error"
        result.error_body = _openai_error(f"The job failed: {exc}", "internal_error")
        _publish(queue, job, {"event": "error", "status": 500, "body": result.error_body})
    finally:
        keeper.stop()
    if keeper.lost.is_set() and result.outcome == "success":
        result.outcome = "cancelled"
    result.finished_at = time.time()
    return result


def _engine_body(request: dict[str, Any]) -> dict[str, Any]:
    body = dict(request["body"])
    if request["stream"]:
        # Always ask for usage, to charge the real tokens; the view drops it if not asked.
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return body


def _stream_chunks(client: EngineClient, request: dict[str, Any]) -> Iterator[dict[str, Any]]:
    body = _engine_body(request)
    if request["endpoint"] == "chat":
        return client.stream_chat(body)
    return client.stream_completion(body)


def _run_streaming(
    queue: FairQueue,
    job: Job,
    client: EngineClient,
    request: dict[str, Any],
    keeper: LeaseKeeper,
    result: RunResult,
) -> None:
    chunks = _stream_chunks(client, request)
    next_check = time.monotonic() + CANCEL_CHECK_S
    finished = False
    try:
        for chunk in chunks:
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + CANCEL_CHECK_S
                if not keeper.still_ours():
                    keeper.lost.set()
                    return  # closing the stream makes vLLM abort the request
            choices = chunk.get("choices") or []
            if result.first_token_at is None and choices:
                result.first_token_at = time.time()
            finished = finished or any(choice.get("finish_reason") for choice in choices)
            usage = chunk.get("usage")
            if usage:
                result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                result.completion_tokens = int(usage.get("completion_tokens") or 0)
            _publish(queue, job, {"event": "chunk", "data": chunk})
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    if not finished:
        # An engine whose core died can still end the stream with [DONE] (seen when the
        # engine was killed mid-stream): without a finish reason, the answer is cut short.
        raise EngineUnavailable("the engine's stream ended without a finish reason")
    result.done_event = {"event": "done", "usage": _usage(result), "attempt": job.attempt}


def _run_whole(job: Job, client: EngineClient, request: dict[str, Any], result: RunResult) -> None:
    body = _engine_body(request)
    response = client.chat(body) if request["endpoint"] == "chat" else client.completion(body)
    result.first_token_at = time.time()
    usage = response.get("usage") or {}
    result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    result.completion_tokens = int(usage.get("completion_tokens") or 0)
    result.response_body = response
    result.done_event = {
        "event": "done", "body": response, "usage": _usage(result), "attempt": job.attempt
    }  # fmt: skip


def _usage(result: RunResult) -> dict[str, int]:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


def _answer_engine_refusal(
    queue: FairQueue, job: Job, exc: EngineRequestError, result: RunResult
) -> None:
    """The engine refused the request itself (a 4xx): the client's to fix; pass it on."""
    try:
        body = json.loads(exc.body)
        message = body.get("message") or body.get("error", {}).get("message") or exc.body
    except (ValueError, AttributeError):
        message = exc.body
    result.outcome, result.status_code, result.error_code = "error", exc.status_code, "engine_400"
    error = _openai_error(str(message)[:2000], "invalid_request", "invalid_request_error")
    result.error_body = error
    _publish(queue, job, {"event": "error", "status": exc.status_code, "body": error})


def _engine_lost(
    queue: FairQueue,
    job: Job,
    detail: str,
    result: RunResult,
    on_engine_lost: Callable[[], None] | None,
) -> RunResult:
    """The engine could not be reached or crashed mid-request: try another run, a few times."""
    log.warning("job %s: engine %s unavailable: %s", job.job_id, job.engine_id, detail)
    if on_engine_lost is not None:  # first: the job's next pick must not find a dead engine
        on_engine_lost()
    result.finished_at = time.time()
    if job.attempt < MAX_ATTEMPTS and queue.requeue(
        job.job_id, attempt=job.attempt, reason="engine_unavailable"
    ):
        result.outcome = "requeued"
        return result
    result.outcome, result.status_code, result.error_code = "error", 503, "engine_unavailable"
    result.error_body = _openai_error(
        "The model's engine failed while running this request; please retry.",
        "engine_unavailable",
    )
    _publish(queue, job, {"event": "error", "status": 503, "body": result.error_body})
    queue.release(job.job_id, 0, 0, attempt=job.attempt)
    return result


def _publish(queue: FairQueue, job: Job, event: dict[str, Any]) -> None:
    queue.publish(job.job_id, {**event, "attempt": job.attempt})


def reserved_unit_seconds(job: Job, result: RunResult) -> float:
    return job.kv_bytes / UNIT_BYTES * max(0.0, result.finished_at - result.started_at)
