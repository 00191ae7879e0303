"""The batch feeder: it validates new batches, hands their lines to the fair queue's `offline`
class a window at a time, collects the answers and finalizes each batch with its output and
error files.

Source of truth: the database. Each line is a `BatchLine` row whose state says whether it is
pending (not in the queue), queued (handed to the fair queue under `job_id`) or finished; a
result is written only onto an unfinished line, so a job that runs twice (a reaped lease, a
re-fed line) leaves one result. Redis holds only the window of lines in flight, and the
feeder (`batch_process`, run by the workers' ticker every few seconds and kicked when lines
finish) refills it from here and re-feeds any queued line whose job Redis no longer has (a
flushed or restarted Redis). A line whose job ended without its result reaching the database
gets the answer from the job's events, kept in Redis until the line holds it, and runs again
only if they are gone. A line's job id is derived from the line and its run (`line_job_id`),
so a feed whose transaction failed after it had queued lines finds their jobs on the next
feed.

Life of a batch: validating -> in_progress -> finalizing -> completed; or failed (bad file,
budget), expired (window passed; finished lines still delivered), cancelling -> cancelled.
Running lines are never interrupted: cancel and expiry stop admitting lines, and the batch
is finalized once the running ones have answered."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from billing.stops import money_admit
from capacity.kvcost import kv_cost_of
from fairqueue.domain import JobRejected, JobState, payload_summary
from fairqueue.queue import FairQueue
from plumbing import wire
from plumbing.change_marks import ChangeMark
from plumbing.errors import NotFound
from plumbing.redis import redis_client
from protocol.classes import RequestClass
from protocol.inference import (
    GENERATION_ENDPOINTS,
    InferenceRequest,
    parse_inference_request,
    request_tokens,
    reserved_prompt_tokens,
    split_prompts,
)
from scheduler import worker_tasks
from scheduler.adapters.selectors import adapter_base
from scheduler.batches.files import file_create, file_get, file_lines, file_open
from scheduler.batches.objects import output_record, stop_error
from scheduler.batches.validation import (
    ENDPOINTS_BY_PATH,
    MAX_REPORTED_ERRORS,
    LineError,
    model_check,
    validate_input,
)
from scheduler.engines.calls import affinity_key
from scheduler.models import (
    ACTIVE_BATCH_STATUSES,
    UNFINISHED_LINE_STATES,
    Batch,
    BatchLine,
    BatchStatus,
    BatchStop,
    FilePurpose,
    LineState,
)
from scheduler.online.admission import AnswerTooLarge, ContextTooLong, bounded_max_tokens
from scheduler.pools.policies import Route, enqueue_resyncing, fair_queue, route_for, sync_tenant
from tenants.limits import BudgetExhausted, RateLimited, limits_admit, limits_settle
from tracing import spans

log = logging.getLogger(__name__)
KICK_KEY = "gs:batch:kick:{pk}"
TRAILING_KICK_KEY = "gs:batch:trail:{pk}"
KICK_EVERY_MS = 500
FINISHED_JOB_STATES = (JobState.DONE, JobState.CANCELLED, JobState.EXPIRED)


STOP_LINE_STATE = {
    BatchStop.EXPIRED: LineState.EXPIRED,
    BatchStop.CANCELLED: LineState.CANCELLED,
    BatchStop.BUDGET: LineState.FAILED,
}


def _validate_batch(batch: Batch, now: datetime) -> None:
    try:
        stored = file_get(tenant=batch.tenant, file_id=batch.input_file_id)
        handle = file_open(stored)
    except (NotFound, OSError):
        _fail(batch, [LineError(None, "file_not_found", "The input file no longer exists.")], now)
        return
    with handle:
        limit = settings.GPUSHARE_BATCH_MAX_FILE_BYTES
        if handle.size > limit:
            _fail(
                batch,
                [
                    LineError(
                        None, "file_too_large", f"The input file is larger than {limit} bytes."
                    )
                ],
                now,
            )
            return
        # Read from the storage a chunk at a time, as validation goes.
        validation = validate_input(
            file_lines(handle),
            endpoint_path=batch.endpoint,
            max_lines=settings.GPUSHARE_BATCH_MAX_LINES,
            model_check=model_check(batch.tenant, batch.endpoint, batch.api_key),
            enabled=batch.tenant.enabled_fields,
        )
    if not validation.ok:
        _fail(batch, validation.errors, now)
        return
    BatchLine.objects.bulk_create(
        (
            BatchLine(
                batch=batch,
                index=line.index,
                custom_id=line.custom_id,
                model=line.model,
                body=line.body,
            )
            for line in validation.lines
        ),
        batch_size=1000,
    )
    batch.status, batch.in_progress_at = BatchStatus.IN_PROGRESS, now
    batch.save(update_fields=["status", "in_progress_at"])


def _fail(batch: Batch, errors: list[LineError], now: datetime) -> None:
    data = [asdict(e) for e in errors[:MAX_REPORTED_ERRORS]]
    batch.errors = {"object": "list", "data": data}
    batch.status, batch.failed_at = BatchStatus.FAILED, now
    batch.save(update_fields=["errors", "status", "failed_at"])


# --- the feeder ---------------------------------------------------------------------------


def kick(batch_pk: int) -> None:
    """Asks a worker to process the batch soon (at most every KICK_EVERY_MS per batch)."""
    if redis_client().set(KICK_KEY.format(pk=batch_pk), 1, nx=True, px=KICK_EVERY_MS):
        worker_tasks.process_batch(batch_pk)


def _feed_soon(batch_pk: int) -> None:
    """Tops the batch up from the worker thread that just finished one of its lines (at most
    every KICK_EVERY_MS): a kicked task would wait while every worker thread is busy running
    lines, and the window would drain meanwhile. A finish that falls inside the interval
    leaves one delayed kick instead, so the last lines of a window still wake the feeder
    (threads are free by then) rather than waiting for the ticker's next feed."""
    client = redis_client()
    if client.set(KICK_KEY.format(pk=batch_pk), 1, nx=True, px=KICK_EVERY_MS):
        batch_process(batch_pk=batch_pk)
    elif client.set(TRAILING_KICK_KEY.format(pk=batch_pk), 1, nx=True, px=KICK_EVERY_MS):
        worker_tasks.process_batch(batch_pk, countdown=KICK_EVERY_MS / 1000)


def batch_changes() -> ChangeMark:
    """Counts saves of batches' rows (scheduler.signals), for `batches_tick_if_changed`."""
    return ChangeMark("batches", recheck_s=settings.GPUSHARE_CHANGE_RECHECK_S)


def batches_tick_if_changed() -> int | None:
    """`batches_tick` unless it found no active batch last time and no batch was saved since
    (a batch becomes active only when it is created); None when it did not look."""
    # Nothing looked at: nothing to feed until a batch is saved.
    return batch_changes().run_if_moved(batches_tick, settled=lambda looked_at: looked_at == 0)


def batches_tick() -> int:
    """Processes every batch that still has work; returns how many were looked at."""
    pks = list(Batch.objects.filter(status__in=ACTIVE_BATCH_STATUSES).values_list("pk", flat=True))
    for pk in pks:
        try:
            batch_process(batch_pk=pk)
        except Exception:  # one broken batch must not stop the others
            log.exception("batch %s: processing failed", pk)
    return len(pks)


def batch_process(*, batch_pk: int, queue: FairQueue | None = None) -> None:
    """One step of the batch's life, under its row lock (a concurrent step skips it)."""
    queue = queue or fair_queue()
    dispatches: list[str] = []
    with transaction.atomic():
        batch = (
            Batch.objects.select_for_update(skip_locked=True)
            .select_related("tenant")
            .filter(pk=batch_pk, status__in=ACTIVE_BATCH_STATUSES)
            .first()
        )
        if batch is None:
            return
        now = timezone.now()
        if batch.status == BatchStatus.VALIDATING:
            _validate_batch(batch, now)
        if batch.status == BatchStatus.IN_PROGRESS and now >= batch.expires_at:
            stop_batch(batch, BatchStop.EXPIRED, now)
        if batch.status == BatchStatus.IN_PROGRESS:
            dispatches = _feed(batch, queue, now)
        if batch.stop_reason:
            stop_queued_lines(batch, queue, now)
        if batch.status in (
            BatchStatus.IN_PROGRESS,
            BatchStatus.FINALIZING,
            BatchStatus.CANCELLING,
        ) and not _has_unfinished(batch):
            _finalize(batch, now)
    if dispatches:
        for pool in dispatches:
            worker_tasks.dispatch(pool)


def _has_unfinished(batch: Batch) -> bool:
    return batch.lines.filter(state__in=UNFINISHED_LINE_STATES).exists()


def _audit_queued(batch: Batch, queue: FairQueue, now: datetime) -> tuple[int, list[BatchLine]]:
    """Looks up each queued line's job in Redis: returns how many are really in flight and
    the lines that are lost (their job is gone, or ended without a result past the grace)."""
    lines = list(
        batch.lines.filter(state=LineState.QUEUED).only("pk", "job_id", "job_pool", "lost_seen_at")
    )
    if not lines:
        return 0, []
    pipe = queue.redis.pipeline()
    for line in lines:
        pipe.hget(queue.keys.job(line.job_pool, line.job_id), "state")
    states = pipe.execute()
    grace = timedelta(seconds=settings.GPUSHARE_BATCH_LOST_GRACE_S)
    live, lost = 0, []
    for line, state in zip(lines, states, strict=True):
        if state is None:
            lost.append(line)
        elif state in FINISHED_JOB_STATES:
            # The worker may be writing the result right now: give it a grace period.
            if line.lost_seen_at is None:
                BatchLine.objects.filter(pk=line.pk, lost_seen_at__isnull=True).update(
                    lost_seen_at=now
                )
                live += 1
            elif now - line.lost_seen_at <= grace:
                live += 1
            elif not _recover_answer(queue, line):
                lost.append(line)
        else:
            live += 1
    return live, lost


def _recover_answer(queue: FairQueue, line: BatchLine) -> bool:
    """Writes the answer of a line whose job ended but whose answer never reached the
    database (its worker died, or lost the database, right after the run): the job's events
    still hold it, so the line is not run a second time. False when they do not."""
    for event in reversed(queue.events(line.job_pool, line.job_id)):
        if event.get("event") == "done":
            fields = _answer_fields(line.job_id, event.get("body"), None, 200)
        elif event.get("event") == "error":
            fields = _answer_fields(line.job_id, None, event.get("body"), event.get("status", 500))
        else:
            continue
        if fields is None:
            return False
        try:
            with transaction.atomic():  # a savepoint: the feed goes on if this write fails
                BatchLine.objects.filter(pk=line.pk, state__in=UNFINISHED_LINE_STATES).update(
                    **fields
                )
        except DatabaseError:
            log.exception(
                "batch line %s: the answer of job %s cannot be stored", line.pk, line.job_id
            )
            return False  # the line runs again
        log.info("batch line %s: answer of job %s recovered from its events", line.pk, line.job_id)
        return True
    return False


def line_job_id(batch: Batch, line: BatchLine) -> str:
    """The fair-queue job of the line's next run. Derived, not random: a feed whose
    transaction rolled back after it had enqueued (Redis keeps what the database forgets)
    finds its job again on the next feed instead of running the line a second time."""
    return f"{batch.public_id}-{line.index}-{line.runs + 1}"


def _feed(batch: Batch, queue: FairQueue, now: datetime) -> list[str]:
    """Re-feeds lost lines and tops the batch up to its window; returns the pools it fed
    (each to be summoned once: a pool's picker runs as many lines as the queue admits)."""
    live, lost = _audit_queued(batch, queue, now)
    for line in lost:
        log.info(
            "batch %s: line %s lost its job %s; feeding it again",
            batch.public_id,
            line.pk,
            line.job_id,
        )
        BatchLine.objects.filter(pk=line.pk, state=LineState.QUEUED, job_id=line.job_id).update(
            state=LineState.PENDING, job_id="", lost_seen_at=None
        )
    room = settings.GPUSHARE_BATCH_WINDOW - live
    if room <= 0:
        return []
    pending = list(
        batch.lines.select_for_update().filter(state=LineState.PENDING).order_by("index")[:room]
    )
    if not pending:
        return []
    sync_tenant(batch.tenant, queue)
    feeder = _Feeder(batch, queue, now)
    for model in sorted({line.model for line in pending}):
        if not feeder.feed_model(model, [line for line in pending if line.model == model]):
            break
    return feeder.dispatches


@dataclass
class _Feeder:
    """Hands pending lines of one batch to the fair queue, one model's lines at a time."""

    batch: Batch
    queue: FairQueue
    now: datetime
    dispatches: list[str] = field(default_factory=list)
    fed: list[BatchLine] = field(default_factory=list)

    def flush(self) -> None:
        """Marks the lines handed to the queue, in one statement. Their rows are locked by
        this transaction, so a worker that finishes one first waits for the commit."""
        BatchLine.objects.bulk_update(
            self.fed,
            ["state", "job_id", "job_pool", "runs", "fed_at", "lost_seen_at"],
            batch_size=500,
        )
        self.fed.clear()

    def feed_model(self, model: str, lines: list[BatchLine]) -> bool:
        """False when feeding must stop for this tick (limits, budget)."""
        # A line may name the tenant's adapter: it runs on its base model's engines.
        base = adapter_base(tenant=self.batch.tenant, name=model)
        route = route_for(tenant=self.batch.tenant, served_model_name=base or model)
        if route is None:
            return True  # no ready engine of this model now: its lines wait
        endpoint = ENDPOINTS_BY_PATH[self.batch.endpoint]
        enabled = self.batch.tenant.enabled_fields
        most = settings.GPUSHARE_MAX_SEQUENCES_PER_REQUEST
        requests = [parse_inference_request(endpoint, line.body, enabled, most) for line in lines]
        # A byte bound, not the engine's /tokenize: a busy engine takes seconds to count a
        # window's prompts, and the feed would stall while the window drains
        # (docs/decisions/0008-the-request-path-spends-cpu-once.md). The real counts are
        # charged when each line ends.
        counts = [[reserved_prompt_tokens(p) for p in split_prompts(r)] for r in requests]
        try:
            for line, request, prompt_tokens in zip(lines, requests, counts, strict=True):
                if not self._feed_line(line, request, prompt_tokens, route, bool(base)):
                    return False
            return True
        finally:
            self.flush()

    def _feed_line(
        self,
        line: BatchLine,
        request: InferenceRequest,
        prompt_tokens: list[int],
        route: Route,
        adapter: bool = False,
    ) -> bool:
        try:
            longest = max(prompt_tokens)
            max_tokens = bounded_max_tokens(request, longest, route.engine.max_model_len)
        except (ContextTooLong, AnswerTooLarge) as exc:
            _finish_unrun(line, 400, exc.code or "context_length_exceeded", exc.message, exc.param)
            return True
        tenant = self.batch.tenant
        try:
            money_admit(tenant_id=tenant.pk, api_key_id=self.batch.api_key_id)
            admission = limits_admit(
                tenant=tenant,
                estimated_tokens=request_tokens(request, prompt_tokens, max_tokens),
                api_key=self.batch.api_key,
            )
        except RateLimited:
            return False  # rpm/tpm: the batch pauses until the next tick
        except BudgetExhausted:
            self.flush()  # lines fed so far are queued, not stopped with the pending ones
            stop_batch(self.batch, BatchStop.BUDGET, self.now)
            return False
        body = request.body
        if request.endpoint in GENERATION_ENDPOINTS:
            body = {**body, "max_tokens": max_tokens}
            body.pop("max_completion_tokens", None)
        job_id = line_job_id(self.batch, line)
        payload = {
            "endpoint": request.endpoint,
            "body": body,
            "stream": False,
            "include_usage": False,
            "tenant_id": tenant.pk,
            "cache_group": tenant.cache_group,
            "api_key_id": self.batch.api_key_id,
            "model": request.model,
            "adapter": request.model if adapter else "",  # loaded on its engine first
            "admission": admission.settling_fields(),
            "received_at": self.now.timestamp(),
            "batch_id": self.batch.public_id,
            "batch_pk": self.batch.pk,
            "custom_id": line.custom_id,
            "line": line.index,
        }
        # Each line's trace starts here; the worker that runs it continues it.
        span = spans.start("gpushare.batch.line", parent=spans.NEW_TRACE)
        if span is not None:
            span.set_attributes(_line_attributes(self.batch, line, job_id, route.pool))
            payload["trace"] = spans.carrier(span)
        job_fields: dict[str, Any] = {
            "tenant": tenant.slug,
            "pool": route.pool,
            "request_class": RequestClass.OFFLINE,
            "prompt_tokens": sum(prompt_tokens),
            "max_tokens": max_tokens * request.sequences,
            "seqs": request.sequences,
            "job_id": job_id,
            **kv_cost_of(
                bytes_per_token=route.kv_bytes_per_token,
                prompt_tokens=prompt_tokens,
                max_tokens=max_tokens,
                n=request.n,
                block_size=route.engine.block_size,
            ).enqueue_fields(),
            "payload": wire.dumps(payload),
            "summary": payload_summary(payload),
            "affinity": affinity_key(tenant.pk, tenant.cache_group, str(payload["adapter"])),
        }
        try:
            self._enqueue(job_fields, route)
        except JobRejected as exc:
            spans.end(span, error=exc.reason)
            limits_settle(admission=admission, used_tokens=0)  # counted by the first feed
            if exc.reason == "no_engine":
                return False
            if exc.reason != "duplicate_job":  # duplicate: already queued by a rolled-back feed
                _finish_unrun(line, 400, exc.reason, exc.message, "max_tokens")
                return True
        spans.end(span)
        line.state, line.job_id, line.runs = LineState.QUEUED, job_id, line.runs + 1
        line.job_pool = route.pool
        line.fed_at, line.lost_seen_at = self.now, None
        self.fed.append(line)
        # One summons per pool: the picker it starts runs as many lines as the queue admits.
        if route.pool not in self.dispatches:
            self.dispatches.append(route.pool)
        return True

    def _enqueue(self, job_fields: dict[str, Any], route: Route) -> None:
        enqueue_resyncing(
            lambda: self.queue.enqueue(**job_fields),
            engine=route.engine,
            tenant=self.batch.tenant,
            queue=self.queue,
        )


def _line_attributes(batch: Batch, line: BatchLine, job_id: str, pool: str) -> spans.Attributes:
    return {
        "gpushare.request_id": job_id,
        "gpushare.batch_id": batch.public_id,
        "gpushare.batch_line": line.index,
        "gpushare.custom_id": line.custom_id,
        "gpushare.tenant": batch.tenant.slug,
        "gpushare.pool": pool,
    }


def _finish_unrun(
    line: BatchLine, status_code: int, code: str, message: str, param: str | None
) -> None:
    """A line the platform answers itself, without running it (it can never run)."""
    body = {
        "error": {"message": message, "type": "invalid_request_error", "code": code, "param": param}
    }
    BatchLine.objects.filter(pk=line.pk, state__in=UNFINISHED_LINE_STATES).update(
        state=LineState.FAILED,
        response={"status_code": status_code, "request_id": "", "body": body},
        finished_at=timezone.now(),
    )


# --- stopping and finishing -----------------------------------------------------------------


def stop_batch(batch: Batch, reason: str, now: datetime) -> None:
    """Stops admitting lines; lines already running finish and are delivered."""
    batch.stop_reason = reason
    if reason == BatchStop.CANCELLED:
        batch.status, batch.cancelling_at = BatchStatus.CANCELLING, now
    else:
        batch.status, batch.finalizing_at = BatchStatus.FINALIZING, now
    if reason == BatchStop.EXPIRED:
        batch.expired_at = now
    batch.save(
        update_fields=["stop_reason", "status", "cancelling_at", "finalizing_at", "expired_at"]
    )
    batch.lines.filter(state=LineState.PENDING).update(
        state=STOP_LINE_STATE[BatchStop(reason)], error=stop_error(reason), finished_at=now
    )


def stop_queued_lines(batch: Batch, queue: FairQueue, now: datetime) -> None:
    """Takes the batch's waiting jobs out of the queue (running ones finish); a line whose
    job is lost is not fed again but marked as not run."""
    reason = batch.stop_reason
    _, lost = _audit_queued(batch, queue, now)
    lost_ids = {line.pk for line in lost}
    for line in batch.lines.filter(state=LineState.QUEUED).only("pk", "job_id", "job_pool"):
        if line.pk not in lost_ids:
            job = queue.get_job(line.job_pool, line.job_id)
            if job is None or job.state != JobState.QUEUED:
                continue
            # Atomic in Redis: if it was picked meanwhile, it is running and will answer.
            cancelled = queue.cancel(line.job_pool, line.job_id, reason=f"batch_{reason}")
            if cancelled != JobState.QUEUED:
                continue
        BatchLine.objects.filter(pk=line.pk, state=LineState.QUEUED, job_id=line.job_id).update(
            state=STOP_LINE_STATE[BatchStop(reason)], error=stop_error(reason), finished_at=now
        )


FINAL_STATUS = {
    BatchStop.NONE: BatchStatus.COMPLETED,
    BatchStop.CANCELLED: BatchStatus.CANCELLED,
    BatchStop.EXPIRED: BatchStatus.EXPIRED,
    BatchStop.BUDGET: BatchStatus.FAILED,
}


def _finalize(batch: Batch, now: datetime) -> None:
    """Every line has finished: writes the output and error files, sets the final status."""
    batch.finalizing_at = batch.finalizing_at or now
    lines = batch.lines.order_by("index")
    succeeded = lines.filter(state=LineState.SUCCEEDED)
    others = lines.exclude(state=LineState.SUCCEEDED)
    if succeeded.exists():
        batch.output_file_id = _write_results(batch, succeeded, "output").public_id
    if others.exists():
        batch.error_file_id = _write_results(batch, others, "errors").public_id
    status = FINAL_STATUS[BatchStop(batch.stop_reason)]
    batch.status = status
    if status == BatchStatus.COMPLETED:
        batch.completed_at = now
    elif status == BatchStatus.CANCELLED:
        batch.cancelled_at = now
    elif status == BatchStatus.FAILED:
        batch.failed_at = now
        batch.errors = {
            "object": "list",
            "data": [{"line": None, "param": None, **stop_error(BatchStop.BUDGET)}],
        }
    batch.save()


def _write_results(batch: Batch, lines: QuerySet[BatchLine], kind: str) -> Any:
    def chunks() -> Iterator[bytes]:
        for line in lines.iterator(chunk_size=1000):
            yield (json.dumps(output_record(line), separators=(",", ":")) + "\n").encode()

    return file_create(
        tenant=batch.tenant,
        purpose=FilePurpose.BATCH_OUTPUT,
        filename=f"{batch.public_id}_{kind}.jsonl",
        chunks=chunks(),
    )


def batch_line_finished(
    *,
    pool: str,
    job_id: str,
    request: dict[str, Any],
    response_body: dict[str, Any] | None,
    error_body: dict[str, Any] | None,
    status_code: int,
) -> bool:
    """Writes a run's answer onto its line, once: a line already finished (by an earlier run
    of the same line, or stopped) keeps its result. True when this run's answer was kept.

    Never raises: a result that cannot be written leaves the line queued with its job ended,
    and the feeder takes it from the job's events after the grace period."""
    fields = _answer_fields(job_id, response_body, error_body, status_code)
    if fields is None:
        return False  # the run was cut short (cancelled, lease lost): the line runs again
    try:
        written = BatchLine.objects.filter(
            batch_id=request["batch_pk"],
            custom_id=request["custom_id"],
            state__in=UNFINISHED_LINE_STATES,
        ).update(**fields)
    except Exception:  # the feeder writes it from the job's events after the grace period
        log.exception(
            "batch line %s of job %s: result not written", request.get("custom_id"), job_id
        )
        return False
    if not written:
        # A line finished already keeps its result; a line not yet committed by the feed that
        # queued it (a run that ended before that feed did) is not seen: its answer stays in
        # the job's events, and the feeder writes it from there after the grace period
        # rather than running the line again.
        return False
    try:
        fair_queue().forget_events(pool, job_id)  # stored in the database now; nobody reads them
        _feed_soon(int(request["batch_pk"]))
    except Exception:  # the ticker's next feed tops the window up instead
        log.exception("batch %s: feeding after line %s failed", request["batch_pk"], job_id)
    return True


def _answer_fields(
    job_id: str, response_body: Any, error_body: Any, status_code: int
) -> dict[str, Any] | None:
    """The line's columns for a run's answer; None when the run gave none."""
    if response_body is not None:
        state, body, status_code = LineState.SUCCEEDED, response_body, 200
    elif error_body is not None:
        state, body = LineState.FAILED, error_body
    else:
        return None
    return {
        "state": state,
        "finished_at": timezone.now(),
        "response": {"status_code": status_code, "request_id": job_id, "body": body},
    }
