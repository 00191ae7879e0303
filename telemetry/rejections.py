"""Requests refused before a job exists: the web notes them in Redis (one HINCRBY, never a
database write on the request path), and each tick resolves them to tenants, counts them and
writes them to the ledger. Also the jobs that timed out waiting, and the prompt tokens the
engines counted beyond what was reserved."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime

import redis

from fairqueue.queue import FairQueue
from plumbing.redis import redis_client
from protocol.classes import REQUEST_CLASSES
from telemetry.ledger import SEP, counter_field
from telemetry.live import PREFIX, read_hash
from tenants.keys import hash_key
from tenants.models import ApiKey, Outcome, UsageRecord
from tenants.usage_buffer import end_user

log = logging.getLogger(__name__)


# One Redis Cluster hash tag for the three: a drain renames one to another and writes two in
# one transaction.
REJECTIONS_KEY = PREFIX + "{rejections}"
PENDING_REJECTIONS_KEY = PREFIX + "{rejections}:pending"
DRAINING_REJECTIONS_KEY = PREFIX + "{rejections}:draining"
# Prompt tokens the engines counted beyond what was reserved, by tenant (what the KV
# reservation and the quota missed: a hole in the prompt's bound).
UNRESERVED_KEY = PREFIX + "unreserved_prompt_tokens"


# --- rejections: refused before a job exists ---------------------------------------------


REJECTION_FIELDS = 6  # key hash, reason, status, class, endpoint, second


def rejection_note(
    *,
    authorization: str,
    reason: str,
    status: int,
    request_class: str,
    endpoint: str,
    at: float,
    client: redis.Redis | None = None,
) -> None:
    """Notes one refused request: a single HINCRBY, cheap enough for the web view.

    The key is kept as its hash (as the database keeps it); the sampler resolves it to a
    tenant, counts it for /metrics/cluster and writes `rejected` rows to the ledger. A 401's
    key is not anyone's, so it is not even hashed.
    """
    parts = authorization.split()
    key_hash = hash_key(parts[1]) if len(parts) == 2 and status != 401 else ""
    # The class comes from a client's header: only a known one is kept (a tab in it would
    # add a field to the name), and the ledger gives the key's default class otherwise.
    request_class = request_class if request_class in REQUEST_CLASSES else ""
    name = counter_field(key_hash, reason, status, request_class, endpoint, int(at))
    (client or redis_client()).hincrby(PENDING_REJECTIONS_KEY, name, 1)


def rejections_drain(client: redis.Redis | None = None) -> int:
    """The rejections noted since the last drain: counted by tenant, reason and status for
    /metrics/cluster, and written to the ledger (outcome `rejected`, or `timeout` for a queue
    timeout) when the key was a tenant's. Returns how many were drained."""
    client = client or redis_client()
    # One round trip on a tick with nothing noted, nearly every tick: a drain cut short
    # is finished first, else what is pending becomes the drain.
    pipe = client.pipeline(transaction=False)
    pipe.exists(DRAINING_REJECTIONS_KEY)
    pipe.exists(PENDING_REJECTIONS_KEY)
    draining, pending = pipe.execute()
    if not draining:
        if not pending:
            return 0
        try:
            client.rename(PENDING_REJECTIONS_KEY, DRAINING_REJECTIONS_KEY)
        except redis.ResponseError:  # nothing pending any more
            return 0
    noted: list[tuple[list[str], int]] = []
    for field_name, value in read_hash(client, DRAINING_REJECTIONS_KEY).items():
        fields = field_name.split(SEP)
        if len(fields) != REJECTION_FIELDS:  # never raise on it: every later drain would
            log.warning("dropping a malformed rejection note: %r", field_name[:200])
            continue
        noted.append((fields, int(value)))
    hashes = {parts[0] for parts, _ in noted if parts[0]}
    keys = {
        k.hashed_key: k
        for k in ApiKey.objects.select_related("tenant").filter(hashed_key__in=hashes)
    }
    counts: dict[str, int] = {}
    records: list[UsageRecord] = []
    for (key_hash, reason, status, request_class, endpoint, at), count in noted:
        api_key = keys.get(key_hash)
        tenant = api_key.tenant.slug if api_key is not None else ""
        name = counter_field(tenant, reason, status)
        counts[name] = counts.get(name, 0) + count
        if api_key is None:
            continue
        outcome = Outcome.TIMEOUT if reason == "queue_timeout" else Outcome.REJECTED
        records.append(
            UsageRecord(
                request_id=f"rej-{uuid.uuid4().hex}",
                tenant=api_key.tenant,
                api_key=api_key,
                model="",
                request_class=(
                    request_class if request_class in REQUEST_CLASSES else api_key.default_class
                ),
                endpoint=endpoint,
                outcome=outcome,
                status_code=int(status),
                error_code=reason,
                finished_at=datetime.fromtimestamp(int(at), tz=UTC),
                requests=count,  # the refusals of one key, reason and second: one row
            )
        )
    UsageRecord.objects.bulk_create(records, batch_size=1000)
    pipe = client.pipeline(transaction=True)
    for name, count in counts.items():
        pipe.hincrby(REJECTIONS_KEY, name, count)
    pipe.delete(DRAINING_REJECTIONS_KEY)
    pipe.execute()
    return sum(count for _, count in noted)


def unreserved_prompt_tokens(client: redis.Redis | None = None) -> dict[str, int]:
    """Tenant -> prompt tokens its runs used beyond what they reserved, so far."""
    return {
        tenant: int(v) for tenant, v in read_hash(client or redis_client(), UNRESERVED_KEY).items()
    }


def rejection_counts(client: redis.Redis | None = None) -> dict[tuple[str, str, str], int]:
    """(tenant, reason, status) -> rejections so far; tenant '' when the key was nobody's."""
    raw = read_hash(client or redis_client(), REJECTIONS_KEY)
    counts: dict[tuple[str, str, str], int] = {}
    for name, value in raw.items():
        tenant, reason, status = name.split(SEP)
        counts[(tenant, reason, status)] = int(value)
    return counts


def timeouts_record(
    queue: FairQueue, pool: str, job_ids: Iterable[str], *, now: float | None = None
) -> int:
    """Jobs the fair queue expired (they waited past their class's queue timeout, see
    `FairQueue.expire_waiting`) written to the ledger as `timeout` rows, 503 `queue_timeout`,
    with the wait they had. Idempotent: the row's request id is the job id. Returns how many
    were written. Housekeeping, which expires them in `pool`, is the caller."""
    moment = now if now is not None else time.time()
    records = []
    for job_id in job_ids:
        job = queue.get_job(pool, job_id)
        if job is None or not job.payload:
            continue
        request = json.loads(job.payload)
        received = float(request.get("received_at") or job.enqueued_at)
        waited_ms = int(max(0.0, moment - received) * 1000)
        records.append(
            UsageRecord(
                request_id=job_id,
                tenant_id=request["tenant_id"],
                api_key_id=request.get("api_key_id"),
                model=request.get("model", ""),
                request_class=job.request_class,
                batch_id=request.get("batch_id", ""),
                endpoint=request.get("endpoint", ""),
                end_user=end_user(request.get("body", {})),
                outcome=Outcome.TIMEOUT,
                status_code=503,
                error_code="queue_timeout",
                queue_wait_ms=waited_ms,
                latency_ms=waited_ms,
                finished_at=datetime.fromtimestamp(moment, tz=UTC),
            )
        )
    UsageRecord.objects.bulk_create(records, ignore_conflicts=True)
    return len(records)
