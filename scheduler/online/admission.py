"""The online path, web side: admit a request into the fair queue, then follow its events.

    authenticate -> validate -> route to a pool -> count the prompt (the engine's /tokenize)
    -> bound max_tokens by the model's length -> KV cost -> rate limits -> enqueue -> wait

The waiting side is asynchronous (no thread is held while a request waits in the queue or
streams). Admission runs on the event loop too. The loop never blocks: Redis is asked through
the asyncio client (`plumbing.aio_redis`: the fair queue's scripts, the limits' script, the
events), and whatever is synchronous (the database, a cache refresh, a Celery message, a
ledger row) runs in a thread of the loop's pool (`_in_thread`), or is handed to one and not
waited for (`_in_background`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, NamedTuple, TypeVar

import httpx
import redis
from django.conf import settings
from django.core.exceptions import SynchronousOnlyOperation
from django.db import connection

from billing.stops import money_admit
from capacity.kvcost import kv_cost_of
from fairqueue.aio import AsyncFairQueue
from fairqueue.domain import Job, JobRejected, JobState, payload_summary
from fairqueue.inbox import Inboxes, parse_event
from fairqueue.queue import FairQueue
from plumbing import request_ids, wire
from plumbing.aio_redis import AsyncRedis
from plumbing.change_marks import cache_by_marks
from plumbing.errors import DomainError, Forbidden, NotFound
from plumbing.redis import async_client
from plumbing.ttlcache import TtlCache
from protocol.inference import (
    GENERATION_ENDPOINTS,
    InferenceRequest,
    answer_bytes_bound,
    bounded_prompt_tokens,
    logprob_candidates,
    prompt_token_bound,
    request_tokens,
    split_prompts,
    tier_class,
    tokenize_request_body,
    upper_token_estimate,
)
from scheduler import worker_tasks
from scheduler.adapters.selectors import adapter_base
from scheduler.engines.auth import engine_auth_headers
from scheduler.engines.calls import affinity_key
from scheduler.models import Engine, EngineTask
from scheduler.online.granted import GrantedStream
from scheduler.online.trace import RequestTrace
from scheduler.pools.policies import (
    Route,
    engine_changes,
    fair_queue,
    resync,
    resync_helps,
    route_for,
    sync_tenant,
)
from tenants.auth import authenticate_bearer
from tenants.limits import Admission, RateLimited, limits_admit_async, limits_settle_async
from tenants.models import ApiKey, Tenant
from tenants.selectors import tenant_get
from tenants.services import tenant_changes
from tenants.usage_buffer import end_user, usage_push
from tracing import spans

log = logging.getLogger(__name__)
_T = TypeVar("_T")


class BadRequest(DomainError):
    code = "invalid_request_error"


class ContextTooLong(DomainError):
    code = "context_length_exceeded"


class AnswerTooLarge(DomainError):
    code = "answer_too_large"


class ModelNotFound(NotFound):
    code = "model_not_found"


class Unavailable(DomainError):
    http_status = 503
    error_type = "server_error"
    code = "engine_unavailable"


class QueueTimeout(Unavailable):
    code = "queue_timeout"


class OverQuota(DomainError):
    http_status = 429
    error_type = "insufficient_quota"
    code = "insufficient_quota"


class RequestTooLarge(DomainError):
    http_status = 413
    code = "request_too_large"


# Where a tenant's requests for a model go, for a moment: an engine that stops being ready
# is still refused picks by the queue itself at once; only routing lags, by up to 2 s. The
# route is read again only after an engine's row was saved (the engines' change mark, one
# Redis read per 2 s), or every GPUSHARE_CHANGE_RECHECK_S whatever happened.
_routes: TtlCache[Route | None] = cache_by_marks(2.0, engine_changes)
# Tenants whose policy this process wrote to the queue lately: written again after 5 s only
# if a tenant, a key or an engine (a dedicated one counts against the quota) was saved since,
# and at least every GPUSHARE_CHANGE_RECHECK_S (a queue that lost it is re-taught on the
# spot, see _enqueue).
_synced_tenants: TtlCache[None] = cache_by_marks(5.0, tenant_changes, engine_changes)
# A tenant's adapters by name (their base model's name, None for any other name): read again
# after 5 s only if a tenant's row or an adapter changed since (an adapter removed is refused
# within 5 s).
_adapters: TtlCache[str | None] = cache_by_marks(5.0, tenant_changes)


@dataclass(frozen=True)
class Admitted:
    """A request in the queue, and what its waiter needs to follow it."""

    job: Job
    request: InferenceRequest
    tenant_id: int
    api_key_id: int
    received_at: float
    # Where the loop's inbox puts the job's events: registered before the job is queued.
    # None: registered when followed (tests that make up a request already waiting).
    events: asyncio.Queue[bytes] | None = None
    # The engine call as queued (endpoint, body, stream, include_usage): what a granted
    # stream sends the engine (scheduler.online.granted).
    call: dict[str, Any] = field(default_factory=dict)
    # The tenant's x-ratelimit-* headers as its limits stood once this request was counted.
    rate_limits: dict[str, str] = field(default_factory=dict)
    # Its spans on the web, where tracing is on.
    trace: RequestTrace | None = None


@dataclass(frozen=True)
class _Prepared:
    api_key: ApiKey
    request: InferenceRequest
    request_class: str
    route: Route
    adapter: bool = False  # the model is the tenant's adapter of the route's model


def check_body_size(size: int) -> None:
    limit = settings.GPUSHARE_MAX_BODY_BYTES
    if size > limit:
        raise RequestTooLarge(f"The request body is {size} bytes; the limit is {limit} bytes.")


def parse_json_body(body: bytes) -> Any:
    try:
        return wire.loads_request(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadRequest("The request body is not valid UTF-8.") from None
    except ValueError as exc:
        raise BadRequest(f"The request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("The request body is nested too deeply.") from None


def _prepare(
    authorization: str,
    request: InferenceRequest,
    class_header: str,
    api_key: ApiKey | None = None,
) -> _Prepared:
    """The key, the class and the route: from the caches on the loop; in one trip to a
    thread when one of them must be read again (see `_here_or_in_thread`)."""
    api_key = api_key or authenticate_bearer(authorization)
    tenant = api_key.tenant
    request_class = (
        class_header
        or request.request_class
        or tier_class(request.service_tier, tenant.allowed_classes)
        or api_key.default_class
    )
    if request_class not in ("interactive", "standard", "offline"):
        raise BadRequest(f"Unknown request class {request_class!r}.", param="X-Request-Class")
    if not tenant.allows_class(request_class):
        raise Forbidden(
            f"Tenant '{tenant.slug}' may not send {request_class} requests "
            f"(allowed: {', '.join(tenant.allowed_classes)}).",
            code="class_not_allowed",
        )
    # The tenant's own adapter of this name runs on its base model's engines; another
    # tenant's is, to this one, a name no model has.
    adapter = _adapters.get_or_compute(
        (tenant.pk, request.model), lambda: adapter_base(tenant=tenant, name=request.model)
    )
    model = adapter or request.model
    if not api_key.allows_model(model):
        whose = f"Tenant '{tenant.slug}'" if not tenant.allows_model(model) else "This key"
        raise Forbidden(
            f"{whose} may not use model '{request.model}'.",
            param="model",
            code="model_not_allowed",
        )
    route = _routes.get_or_compute(
        (tenant.pk, model), lambda: route_for(tenant=tenant, served_model_name=model)
    )
    if route is None or (adapter and not route.engine.max_loras):
        if not Engine.objects.filter(served_model_name=model).exists():
            raise ModelNotFound(f"The model '{request.model}' does not exist.", param="model")
        raise Unavailable(f"No engine of '{request.model}' is ready; retry shortly.")
    embeds = route.engine.task == EngineTask.EMBED
    if embeds != (request.endpoint == "embeddings"):
        does = "embeddings" if embeds else "text generation"
        raise BadRequest(
            f"The model '{request.model}' serves {does}; it does not support {request.path}.",
            param="model",
            code="model_not_supported",
        )
    return _Prepared(api_key, request, request_class, route, adapter is not None)


class _LoopState(NamedTuple):
    """The clients of one event loop (a client is bound to the loop it was made on)."""

    http: httpx.AsyncClient
    redis: AsyncRedis  # every command the loop sends
    queue: AsyncFairQueue  # the fair queue's scripts, over `redis`
    inboxes: Inboxes  # the events of every job the loop waits on, an inbox per pool


# Keyed by the loop itself (weakly).
_loop_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = (
    weakref.WeakKeyDictionary()
)


# How long past a command's own blocking time (the inbox's read waits up to 5 s) the web
# waits for Redis's reply: this only catches a connection that died silently. It must be far
# above any stall of the process: an inbox read's reply that arrives while the process is
# stalled past it is lost (Redis popped the entries, the client drops the connection), and a
# machine busy with CPU engines stalls for seconds.
EVENTS_READ_TIMEOUT_S = 60.0


def inbox_name() -> str:
    """A new inbox's name: one per event loop, unique across the platform's processes."""
    return uuid.uuid4().hex


def _loop_state() -> _LoopState:
    """The clients of the running event loop, made once: a new HTTP client costs tens of ms
    of CPU (TLS context), a new Redis client new connections."""
    loop = asyncio.get_running_loop()
    state = _loop_clients.get(loop)
    if state is None:
        http = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=64))
        # Waiting requests hold no connection (a pool's inbox reads for all of its jobs): the
        # pool is for the commands in flight (admissions' scripts, cancels, one inbox's read
        # per pool waited on).
        client = async_client(
            max_connections=settings.GPUSHARE_WEB_REDIS_CONNECTIONS,
            read_timeout_s=EVENTS_READ_TIMEOUT_S,
        )
        queue = AsyncFairQueue(fair_queue(), client)
        inboxes = Inboxes(client, queue.keys, inbox_name())
        state = _loop_clients[loop] = _LoopState(http, client, queue, inboxes)
    return state


def known_prompt_tokens(request: InferenceRequest, engine: Engine) -> int | None:
    """The prompt's tokens when no engine needs to count them: token-id prompts are their
    own count; a short text prompt's byte bound plus a margin stands in for its count (see
    `bounded_prompt_tokens`). None: ask the engine (`count_prompt_tokens`). For a request of
    one prompt (`split_prompts`)."""
    # Only a completion's prompt is its prompt: the chat endpoint ignores a `prompt` field
    # and runs its messages, which must be counted whatever else the body carries.
    prompt = request.body.get("prompt") if request.endpoint == "completions" else None
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return len(prompt)
    limit = settings.GPUSHARE_COUNT_PROMPTS_ABOVE_TOKENS
    return bounded_prompt_tokens(request, engine.max_model_len, limit)


async def count_prompt_tokens(request: InferenceRequest, engine: Engine) -> int:
    """The prompt's tokens as the engine counts them (chat template included); the UTF-8
    bound if the engine cannot say. Only for the long prompts that `known_prompt_tokens`
    leaves to the engine: under load the engine's answer queues behind every other
    request's, first come first served, in front of the fair queue; a flood of one tenant
    then delayed everyone's admission, and the engine's CPU went to counting."""
    try:
        response = await _loop_state().http.post(
            f"{engine.base_url}/tokenize",
            json=tokenize_request_body(request),
            headers=engine_auth_headers(engine.base_url),
            timeout=5.0,
        )
        if response.status_code == 200:
            return int(response.json()["count"])
        log.info("tokenize answered %s; using the byte bound", response.status_code)
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        log.info("tokenize failed (%s); using the byte bound", exc)
    return prompt_token_bound(request)


async def count_prompts(parts: list[InferenceRequest], engine: Engine) -> list[int]:
    """Each prompt's tokens (`parts`: the request's `split_prompts`): known ones at once,
    the others counted by the engine side by side (`/tokenize` counts one prompt a call)."""
    counts = [known_prompt_tokens(part, engine) for part in parts]
    unknown = [i for i, count in enumerate(counts) if count is None]
    if unknown:
        counted = await asyncio.gather(*(count_prompt_tokens(parts[i], engine) for i in unknown))
        for i, count in zip(unknown, counted, strict=True):
            counts[i] = count
    return [count for count in counts if count is not None]


# The field a request's prompt is in, for the error that says it is too long.
PROMPT_PARAMS = {
    "chat": "messages", "completions": "prompt", "responses": "input", "embeddings": "input",
}  # fmt: skip
# The field that bounds a request's answer.
MAX_TOKENS_PARAMS = {"responses": "max_output_tokens"}


def bounded_max_tokens(request: InferenceRequest, prompt_tokens: int, max_model_len: int) -> int:
    """`max_tokens` as run: as asked, or what the model's length leaves the prompt (the
    longest, for a list of prompts); ContextTooLong when nothing is left, AnswerTooLarge when
    a whole answer could pass what one may take. An embedding (`max_tokens` 0) needs room
    for its input only."""
    room = max_model_len - prompt_tokens
    least = 0 if request.max_tokens == 0 else 1
    if room < least or (request.max_tokens is not None and request.max_tokens > room):
        asked = request.max_tokens if request.max_tokens is not None else 1
        raise ContextTooLong(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + asked} tokens ({prompt_tokens} in the messages, "
            f"{asked} in the completion). Please reduce the length of the messages or "
            "completion.",
            param=PROMPT_PARAMS[request.endpoint],
        )
    max_tokens = request.max_tokens if request.max_tokens is not None else room
    _check_answer_size(request, max_tokens)
    return max_tokens


def _check_answer_size(request: InferenceRequest, max_tokens: int) -> None:
    """A whole answer (not streamed) that could pass GPUSHARE_MAX_ANSWER_BYTES is refused:
    the engine, the worker, Redis and the web would each hold it whole. The field named is
    what weighs most."""
    limit = int(settings.GPUSHARE_MAX_ANSWER_BYTES)
    if request.stream or max_tokens == 0:
        return
    bound = answer_bytes_bound(request, max_tokens)
    if bound <= limit:
        return
    if logprob_candidates(request) > 1:
        param = "logprobs" if request.endpoint == "completions" else "top_logprobs"
    elif request.sequences > 1:
        param = "n" if request.n > 1 else "prompt"
    else:
        param = MAX_TOKENS_PARAMS.get(request.endpoint, "max_tokens")
    raise AnswerTooLarge(
        f"This request's answer could take {bound // 2**20} MiB ({request.sequences} "
        f"sequences of up to {max_tokens} tokens, {logprob_candidates(request)} logprobs "
        f"each); the most one answer may take is {limit // 2**20} MiB. Ask for fewer "
        "sequences, tokens or logprobs, or stream the answer (`stream: true`).",
        param=param,
    )


async def _enqueue(
    prepared: _Prepared,
    prompt_tokens: list[int],
    max_tokens: int,
    admission: Admission,
    received_at: float,
    trace_root: Any = None,
) -> Admitted:
    """Puts the request, counted against its tenant's limits, in the fair queue.
    `trace_root`: the context of the request's server span, where tracing is on."""
    api_key, request, route = prepared.api_key, prepared.request, prepared.route
    engine, tenant = route.engine, api_key.tenant
    body = request.body
    if request.endpoint in GENERATION_ENDPOINTS:
        body = {**body, "max_tokens": max_tokens}
        body.pop("max_completion_tokens", None)
    state = _loop_state()
    # The request's own id where the web gave it one: its X-Request-Id and its log lines' id.
    job_id = request_ids.current() or uuid.uuid4().hex
    inbox = state.inboxes.of(route.pool)
    payload = {
        "inbox": inbox.key,
        "endpoint": request.endpoint,
        "body": body,
        "stream": request.stream,
        "include_usage": request.include_usage,
        "tenant_id": api_key.tenant_id,
        "cache_group": tenant.cache_group,
        "api_key_id": api_key.pk,
        "model": request.model,
        # The engine must hold it before it is called (scheduler.adapters.loading).
        "adapter": request.model if prepared.adapter else "",
        "admission": admission.settling_fields(),  # flat: no deep copy, as asdict makes
        "received_at": received_at,
    }
    # Its wait in the queue starts now; the worker's run continues the trace from its payload.
    wait = spans.start("gpushare.queue.wait", parent=trace_root)
    if wait is not None:
        payload["trace"] = spans.carrier(wait)
    kv = kv_cost_of(
        bytes_per_token=route.kv_bytes_per_token,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        n=request.n,
        block_size=engine.block_size,
    )
    job_fields: dict[str, Any] = {
        "tenant": tenant.slug,
        "pool": route.pool,
        "request_class": prepared.request_class,
        "prompt_tokens": sum(prompt_tokens),
        "max_tokens": max_tokens * request.sequences,
        "seqs": request.sequences,
        **kv.enqueue_fields(),
        # A stream's tokens are counted as they come (by the worker that relays it, or the
        # web it is granted to), so its reservation can grow past a prediction.
        "observed": request.stream,
        "payload": wire.dumps(payload),
        "job_id": job_id,
        "inbox": inbox.key,
        "max_waiting": settings.GPUSHARE_TENANT_MAX_WAITING,
        "summary": payload_summary(payload),
        "affinity": affinity_key(api_key.tenant_id, tenant.cache_group, str(payload["adapter"])),
    }
    events = inbox.register(job_id)  # before the job can say anything
    # A task of its own, shielded: a client that leaves meanwhile does not cut the script's
    # call short, which would leave a job queued that nobody waits for (a task and a shield:
    # about 5 us of CPU under uvloop).
    queuing = asyncio.ensure_future(_queue_job(state.queue, job_fields, engine, tenant))
    try:
        job, summon = await asyncio.shield(queuing)
    except asyncio.CancelledError:
        inbox.unregister(job_id)
        spans.end(wait, error="cancelled")
        _keep(f"the cancel of job {job_id}", asyncio.ensure_future(_cancel_once_queued(queuing)))
        raise
    except JobRejected as exc:
        inbox.unregister(job_id)
        spans.end(wait, error=exc.message)
        raise _rejection(exc) from None
    except BaseException as exc:
        inbox.unregister(job_id)
        spans.end(wait, error=repr(exc))
        raise
    if summon:  # no picker was waiting for work: summon one
        _in_background(f"summoning a picker of {route.pool}", _summon, route.pool)
    trace = None if wait is None else RequestTrace(trace_root, wait)
    return Admitted(job, request, api_key.tenant_id, api_key.pk, received_at, events, payload,
                    admission.headers, trace)  # fmt: skip


async def _queue_job(
    queue: AsyncFairQueue, job_fields: dict[str, Any], engine: Engine, tenant: Tenant
) -> tuple[Job, bool]:
    """`scheduler.pools.policies.enqueue_resyncing`, from the loop: when the queue lost the
    tenant or has not heard of the engine yet, it is told from the database (in a thread), then
    asked once more."""
    try:
        return await queue.enqueue_summoning(**job_fields)
    except JobRejected as exc:
        if not resync_helps(exc):
            raise
    await _in_thread(resync, engine, tenant, queue.queue)
    return await queue.enqueue_summoning(**job_fields)


async def _cancel_once_queued(queuing: asyncio.Future[tuple[Job, bool]]) -> None:
    """The client left while its job was being queued: the job is cancelled once it is."""
    try:
        job, _ = await queuing
    except JobRejected:  # nothing was queued
        return
    await _loop_state().queue.cancel(job.pool, job.job_id, reason="client_gone")


def _sync_policy(api_key: ApiKey, queue: FairQueue) -> None:
    """The tenant's policy in the queue (see `_synced_tenants`), read afresh from its row: the
    key's cached tenant may predate the save that moved the mark, and the policy written now
    is kept until the next save."""
    _synced_tenants.get_or_compute(
        api_key.tenant_id, lambda: sync_tenant(tenant_get(slug=api_key.tenant.slug), queue)
    )


def _summon(pool: str) -> None:
    """Starts (or nudges) a worker's picker for `pool` (a Celery message). A message that is
    lost leaves the job queued until housekeeping's kick summons a picker for the pool."""
    worker_tasks.dispatch(pool)


def _rejection(exc: JobRejected) -> DomainError:
    if exc.reason == "larger_than_quota":
        return OverQuota(
            f"This request needs more GPU memory than the tenant's quota and burst allow: "
            f"{exc.message}. Lower max_tokens or ask for a larger quota."
        )
    if exc.reason == "larger_than_engine":
        return BadRequest(
            f"This request needs more KV cache than any engine of the model has: "
            f"{exc.message}. Lower max_tokens.",
            param="max_tokens",
        )
    if exc.reason == "too_many_waiting":
        return RateLimited(
            f"Too many of this tenant's requests are waiting: {exc.message}. Retry when "
            "some have finished.",
            headers={"Retry-After": "1"},
        )
    return Unavailable(f"The request could not be queued: {exc.message}.")


async def admit(
    *,
    authorization: str,
    request: InferenceRequest,
    class_header: str,
    api_key: ApiKey | None = None,
) -> Admitted:
    """Admission on the event loop. What is cached (the key, the route, the tenant's policy:
    nearly every request) is read there, and Redis is asked through the loop's asyncio client
    (the limits' script, then the queue's: one round trip each, as the waits that follow
    are). A step that must ask the database, or refresh a cache entry, runs in a thread
    instead: it raises SynchronousOnlyOperation on the loop before anything is done, which is
    the signal (`_here_or_in_thread`). The hop to a thread and back (GIL hand-offs, a wake-up
    of the loop) costs a sixth of the web's CPU per request
    (docs/decisions/0008-the-request-path-spends-cpu-once.md): it is made only then.
    `api_key`: the header's key, where the web checked it already. Where tracing is on, it
    is the span gpushare.admit of the request's trace."""
    if not spans.enabled():
        return await _admit(authorization, request, class_header, api_key, None)
    root = spans.here()
    with spans.current("gpushare.admit", {"gpushare.request_id": request_ids.current() or ""}):
        return await _admit(authorization, request, class_header, api_key, root)


async def _admit(
    authorization: str,
    request: InferenceRequest,
    class_header: str,
    api_key: ApiKey | None,
    trace_root: Any,
) -> Admitted:
    received_at = time.time()
    prepared = await _here_or_in_thread(_prepare, authorization, request, class_header, api_key)
    if spans.enabled():
        spans.annotate(_span_attributes(prepared))
    request_ids.bind(tenant=prepared.api_key.tenant.slug)  # its log lines name it from here on
    engine, state = prepared.route.engine, _loop_state()
    # Before the limits count the request: a policy not yet cached is written first.
    await _here_or_in_thread(_sync_policy, prepared.api_key, state.queue.queue)
    # A spending budget with a hard stop, used up: refused before the limits count anything.
    await _here_or_in_thread(_money_check, prepared.api_key)
    # An adapter's prompt is counted by its base model (its tokenizer), which the engine
    # serves whether or not it holds the adapter yet.
    counted = replace(request, model=engine.served_model_name) if prepared.adapter else request
    parts = split_prompts(counted)
    if len(parts) == 1 and (known := known_prompt_tokens(parts[0], engine)) is not None:
        prompt_tokens = [known]
        max_tokens = bounded_max_tokens(request, known, engine.max_model_len)
        admission = await _count(prepared, request_tokens(request, prompt_tokens, max_tokens))
    else:
        # The engine counts a prompt: the limits count the request first, for an upper bound
        # of its tokens (settled to the real ones when it ends), so that a tenant over its
        # limits never makes the engine work.
        admission = await _count(prepared, upper_token_estimate(request, engine.max_model_len))
        try:
            prompt_tokens = await count_prompts(parts, engine)
            max_tokens = bounded_max_tokens(request, max(prompt_tokens), engine.max_model_len)
        except DomainError:
            await _give_back(admission)
            raise
    try:
        return await _enqueue(
            prepared, prompt_tokens, max_tokens, admission, received_at, trace_root
        )
    except DomainError:  # nothing was queued: the request's tokens are given back
        await _give_back(admission)
        raise


def _span_attributes(prepared: _Prepared) -> dict[str, str]:
    return {
        "gpushare.tenant": prepared.api_key.tenant.slug,
        "gpushare.pool": prepared.route.pool,
        "gpushare.class": prepared.request_class,
        "gpushare.model": prepared.request.model,
    }


async def authenticate(authorization: str) -> ApiKey:
    """The live key of the header (InvalidApiKey otherwise): from the cache on the loop, in a
    thread when the database must be asked."""
    return await _here_or_in_thread(authenticate_bearer, authorization)


def _money_check(api_key: ApiKey) -> None:
    """MoneyBudgetExhausted when the key or its tenant is over a hard-stopped money budget
    (billing.stops: a cache; SynchronousOnlyOperation on the loop when it must be read)."""
    money_admit(tenant_id=api_key.tenant_id, api_key_id=api_key.pk)


async def _count(prepared: _Prepared, estimated_tokens: int) -> Admission:
    """Counts the request against its tenant's limits (RateLimited, BudgetExhausted)."""
    return await limits_admit_async(
        tenant=prepared.api_key.tenant,
        estimated_tokens=estimated_tokens,
        client=_loop_state().redis,
        in_thread=_in_thread,
        api_key=prepared.api_key,
    )


async def _give_back(admission: Admission) -> None:
    """The tokens of a request refused after it was counted: it used none. (It still counts
    as a request against requests per minute.)"""
    try:
        await limits_settle_async(admission=admission, used_tokens=0, client=_loop_state().redis)
    except redis.RedisError as exc:  # the refusal stands; the minute's count lapses alone
        log.warning("could not give back a refused request's tokens: %s", exc)


async def _here_or_in_thread(work: Callable[..., _T], *args: Any) -> _T:
    """`work(*args)` on the loop; in a thread when it raises SynchronousOnlyOperation there,
    which it does before it has done anything (a query, a cache refresh: `plumbing.ttlcache`)."""
    try:
        return work(*args)
    except SynchronousOnlyOperation:
        return await _in_thread(work, *args)


async def _in_thread(work: Callable[..., _T], *args: Any) -> _T:
    """Admission's work that asks the database, in a thread of the loop's pool (concurrent
    requests are admitted side by side). The thread hands its database connection back to
    the pool when done: the request may now wait and stream for minutes without it, and
    holding one per waiting request would exhaust the pool under load. (The loop's own
    executor, not asgiref's `sync_to_async`: its extra bookkeeping costs 47 us of CPU per
    trip, 123 against 76, and none of it is needed here: no thread-sensitive code runs.)"""

    def run() -> _T:
        try:
            return work(*args)
        finally:
            connection.close()

    return await asyncio.get_running_loop().run_in_executor(None, run)


# Work handed off and not waited for (a job's cancel, a Celery message, a ledger row), kept
# until it is done: the loop holds only a weak reference to a task, which could otherwise
# be collected before it ran.
_background: set[asyncio.Future[Any]] = set()


def _keep(what: str, future: asyncio.Future[Any]) -> None:
    _background.add(future)
    future.add_done_callback(lambda done: _forget(what, done))


def _forget(what: str, future: asyncio.Future[Any]) -> None:
    _background.discard(future)
    if future.cancelled():  # the loop stopped first
        log.info("%s: not done, the event loop stopped", what)
    elif (exc := future.exception()) is not None:
        log.warning("%s failed", what, exc_info=exc)


def _in_background(what: str, work: Callable[..., Any], *args: Any) -> None:
    """`work(*args)` (synchronous) in a thread of the running loop's pool, not waited for;
    an error is logged."""
    _keep(what, asyncio.get_running_loop().run_in_executor(None, work, *args))


async def background_done() -> None:
    """Waits until the work this loop handed off so far is done."""
    loop = asyncio.get_running_loop()
    while mine := {future for future in _background if future.get_loop() is loop}:
        await asyncio.wait(mine)


# Events that end a job's story for its waiter.
FINAL_EVENTS = frozenset({"done", "error", "expired", "cancelled"})
# What a run says (each with its `attempt`): a requeued run's leftovers may still come.
RUN_WORDS = frozenset({"chunk", "done", "error", "grant"})


async def follow(
    admitted: Admitted, client_gone: asyncio.Event | None = None
) -> AsyncIterator[dict[str, Any]]:
    """The job's events for its current run, in order, until a final one. A run that was
    requeued yields a ``requeued`` event; its leftovers are skipped after that (see
    `_stale`). Ends with CancelledError once `client_gone` is set (at the latest when the
    wait under way ends, see `_wait_s`), so the caller's clean-up cancels the job even if the
    task's own cancellation was lost."""
    trace = admitted.trace
    try:
        async for event in _follow(admitted, client_gone):
            if trace is not None:
                trace.saw(event)
            yield event
    finally:
        _loop_state().inboxes.of(admitted.job.pool).unregister(admitted.job.job_id)
        if trace is not None:
            trace.close()


async def _follow(
    admitted: Admitted, client_gone: asyncio.Event | None
) -> AsyncIterator[dict[str, Any]]:
    job = admitted.job
    events = admitted.events or _loop_state().inboxes.of(job.pool).register(job.job_id)
    requeues = 0
    running = False  # its current run has spoken, or the queue said it runs
    deadline = admitted.job.deadline  # a requeue gives the job a fresh one
    last_event = time.time()
    while True:
        raw = await _next_event(events, _wait_s(deadline, running, time.time()))
        if client_gone is not None and client_gone.is_set():
            raise asyncio.CancelledError
        now = time.time()
        if raw is None:
            deadline, found_running = await _check_still_coming(
                admitted, running, deadline, now - last_event
            )
            if found_running and not running:
                running, last_event = True, now
            continue
        last_event = now
        event = parse_event(raw)
        kind = event.get("event")
        if kind in RUN_WORDS:
            if _stale(event, requeues):
                continue
            running = True
        elif kind == "requeued":
            requeues, running = requeues + 1, False
        if kind == "grant":  # the stream is this process's to make (scheduler.online.granted)
            if admitted.trace is not None:
                admitted.trace.saw(event)
            request_ids.bind(engine=event.get("engine"))  # its log lines name it from here on
            stream = GrantedStream(
                _loop_state().queue, job.pool, job.job_id, job.request_class,
                admitted.call, event, events,
                admitted.trace.engine_parent() if admitted.trace is not None else None,
            )  # fmt: skip
            async for word in stream.events():
                if client_gone is not None and client_gone.is_set():
                    raise asyncio.CancelledError
                yield word
                if word["event"] in FINAL_EVENTS:
                    return
            # The engine refused the request or was lost: the worker's word follows.
            last_event = time.time()
            continue
        yield event
        if kind in FINAL_EVENTS:
            return


async def _next_event(events: asyncio.Queue[bytes], wait_s: float) -> bytes | None:
    """The job's next event from the inbox, or None when none came within `wait_s`."""
    if not events.empty():
        return events.get_nowait()
    try:
        async with asyncio.timeout(wait_s):
            return await events.get()
    except TimeoutError:
        return None


def _stale(words: dict[str, Any], requeues: int) -> bool:
    """Whether a run's words come from a run that was requeued since. Each pick numbers its
    run one past the last (`attempt`), and a job goes back to its queue only with a
    ``requeued`` event, which comes before anything its next run says: after `requeues` of
    them, the current run is number requeues + 1. (So the waiter needs no event at the
    pick: one round trip fewer per request.)"""
    attempt = words.get("attempt")
    return attempt is not None and attempt <= requeues


# The longest one wait for a job's events lasts before its waiter looks at the job itself
# (`_check_still_coming`). A queued job's wait ends just past its queue deadline, so a
# timeout is noticed here on time.
EVENTS_WAIT_S = 5


def _wait_s(deadline: float, running: bool, now: float) -> int:
    """How long the next wait for events may last (whole seconds), for a job queued until
    `deadline`, or running."""
    if running:  # the engine's answer ends it
        return EVENTS_WAIT_S
    until_deadline = deadline + 1.0 - now
    return max(1, min(EVENTS_WAIT_S, math.ceil(until_deadline)))


async def _check_still_coming(
    admitted: Admitted, running: bool, deadline: float, silent_s: float
) -> tuple[float, bool]:
    """Called after each wait without news: a queued job past its deadline is timed out here
    (without waiting for housekeeping); a running job silent too long is given up. Returns the
    queue deadline the job is held to (a job requeued after its engine failed was given a
    fresh one, which its record in the queue has: the wait that was over was not its fault),
    and whether the job runs: one past its deadline that the queue says runs has not spoken
    yet (an answer that is not streamed speaks once, at its end). A job Redis no longer holds
    (a failover lost it) will say nothing more: that is a 503."""
    pool, job_id, queue = admitted.job.pool, admitted.job.job_id, _loop_state().queue
    now = time.time()
    if silent_s >= EVENTS_WAIT_S and not await queue.job_exists(pool, job_id):
        raise _lost()
    if not running and now > deadline + 1.0:
        job = await queue.get_job(pool, job_id)
        if job is None:
            raise _lost()
        if job is not None and job.state == JobState.RUNNING:
            return deadline, True
        if job is not None and job.state == JobState.QUEUED:
            if now <= job.deadline + 1.0:
                return job.deadline, False
            await queue.cancel(pool, job_id, reason="queue_timeout")
            raise _queue_timeout(admitted)
    generate_s = float(settings.GPUSHARE_ENGINE_GENERATE_TIMEOUT_S)
    if running and silent_s > generate_s:
        await queue.cancel(pool, job_id, reason="engine_silent")
        raise Unavailable("The engine stopped answering this request; please retry.")
    return deadline, running


def _lost() -> Unavailable:
    return Unavailable("The request was lost when Redis failed over; please retry.")


def _queue_timeout(admitted: Admitted) -> QueueTimeout:
    waited = time.time() - admitted.received_at
    return QueueTimeout(
        f"The request waited {waited:.0f} s in the {admitted.job.request_class} queue without "
        "free capacity; please retry later.",
        headers={"Retry-After": "5"},
    )


def expired_error(admitted: Admitted) -> QueueTimeout:
    return _queue_timeout(admitted)


def record_broken_stream(admitted: Admitted, chunks_sent: int) -> None:
    """A stream whose run was lost after it had sent chunks ends with an error; nobody else
    writes its ledger row (the rerun is cancelled), so the web does, with what was sent (a
    Redis write, handed to a thread: see `_in_background`)."""
    job, now = admitted.job, time.time()
    row = {
        "request_id": job.job_id, "tenant_id": admitted.tenant_id,
        "api_key_id": admitted.api_key_id, "model": admitted.request.model, "engine": "",
        "request_class": job.request_class, "endpoint": admitted.request.endpoint,
        "end_user": end_user(admitted.request.body),
        "outcome": "error", "status_code": 503, "prompt_tokens": job.prompt_tokens,
        "completion_tokens": chunks_sent, "error_code": "stream_broken",
        "latency_ms": int((now - admitted.received_at) * 1000),
        "finished_at": datetime.fromtimestamp(now, tz=UTC).isoformat(),
    }  # fmt: skip
    _in_background(f"the ledger row of job {job.job_id}", usage_push, row)


def cancel(admitted: Admitted, reason: str) -> None:
    """The waiter went away: frees the job's place or its engine slot. Called from `finally:`
    blocks, the waiter's task cancelled or not: the cancel runs as a task of its own (an
    error is logged), and this returns at once."""
    job_id = admitted.job.job_id
    try:
        cancelling = _loop_state().queue.cancel(admitted.job.pool, job_id, reason=reason)
        _keep(f"the cancel of job {job_id}", asyncio.ensure_future(cancelling))
    except Exception:
        log.warning("could not cancel job %s", job_id, exc_info=True)
