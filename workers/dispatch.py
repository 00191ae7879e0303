"""A worker thread's loop: pick the fairest admissible job of a pool, run it, record it.

One `dispatch(pool)` task keeps its thread busy while the pool has admissible work, so a job
that ends makes room for the next one without waiting for a new message; the housekeeping
beat kicks pools that still have waiting work, in case a message was lost.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any

from config.ttlcache import TtlCache
from scheduler.batches import batch_line_finished
from scheduler.engines.client import EngineClient
from scheduler.engines.supervisor import engine_client
from scheduler.fairqueue.domain import Job
from scheduler.fairqueue.queue import FairQueue
from scheduler.models import Engine
from scheduler.pools import engines_to_pick_for, fair_queue
from scheduler.units import UNIT_BYTES
from tenants.limits import Admission, limits_settle
from tenants.usage_buffer import usage_push
from workers.runner import RunResult, reserved_unit_seconds, run_job

log = logging.getLogger(__name__)


# Engines by name, for their address: a moved or removed engine is seen within the TTL (and a
# job picked for an engine that is gone is given back to its queue).
_engines: TtlCache[Engine | None] = TtlCache(ttl_s=5.0)
_clients: dict[str, EngineClient] = {}
_clients_lock = threading.Lock()


def _client_for(engine: Engine) -> EngineClient:
    """One HTTP client per engine and process, shared by the worker threads (httpx clients
    are thread-safe): a new client costs tens of ms of CPU (TLS context) and a new connection."""
    with _clients_lock:
        client = _clients.get(engine.base_url)
        if client is None:
            client = _clients[engine.base_url] = engine_client(engine)
        return client


def pick_next(queue: FairQueue, pool: str) -> Job | None:
    for engine_id in engines_to_pick_for(pool, queue):
        job = queue.pick(pool, engine_id)
        if job is not None:
            return job
    return None


# How long one dispatch task keeps its thread before handing the pool's remaining work to a
# new message: beat tasks (housekeeping, the ledger flush, samplers) share the threads and
# must get their turn under continuous load.
DISPATCH_TURN_S = 15.0


def dispatch_pool(pool: str, *, max_jobs: int = 10_000, turn_s: float = DISPATCH_TURN_S) -> int:
    """Runs the pool's admissible jobs one after another; returns how many ran."""
    from workers.tasks import dispatch  # the task module imports this one

    queue = fair_queue()
    ran = 0
    started = time.monotonic()
    while ran < max_jobs:
        if time.monotonic() - started > turn_s:
            dispatch.delay(pool)  # the rest of the pool's work, after whatever waits now
            break
        job = pick_next(queue, pool)
        if job is None:
            break
        run_picked(queue, job)
        ran += 1
    return ran


def run_picked(queue: FairQueue, job: Job) -> RunResult:
    engine = _engines.get_or_compute(
        job.engine_id, lambda: Engine.objects.filter(name=job.engine_id).first()
    )
    if engine is None:  # removed while the job waited: give it back for another engine
        queue.requeue(job.job_id, attempt=job.attempt, reason="engine_removed")
        return RunResult(outcome="requeued")
    result = run_job(queue, job, _client_for(engine))
    if result.outcome != "requeued":
        settle_and_record(job, result)
    return result


def settle_and_record(job: Job, result: RunResult) -> None:
    request = json.loads(job.payload)
    used = result.prompt_tokens + result.completion_tokens
    admission = request.get("admission")
    if admission:
        try:
            limits_settle(admission=Admission(**admission), used_tokens=used)
        except Exception:  # a missed refund only errs on the strict side
            log.warning("could not settle limits of job %s", job.job_id, exc_info=True)
    usage_push(usage_fields(job, request, result))
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
