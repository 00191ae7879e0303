"""Per-tenant request and token limits (rpm, tpm, token budget per period), and a key's own
rpm and tpm within them, kept in Redis.

Checked when a request arrives, before it is queued, in one Lua script so two concurrent
requests cannot both pass the last free slot, and a request passes its tenant's limits and
its key's or counts in neither. Minutes use a sliding-window estimate (the previous minute's
count weighted by how much of it still overlaps the last 60 s), which smooths the burst a
fixed window allows at each minute boundary.

Tokens are counted first as the request's estimate (prompt + max_tokens, the most it can use)
and settled to the real count when it ends, so tpm and the budget are never under-counted
while a request runs. The budget counter is seeded from the usage ledger when Redis does not
have it (after a Redis restart), so a restart does not reset anyone's budget: the script says
so (`seed`) and counts nothing, the caller seeds the counter and runs it again.

The script also answers what the minute limits leave (the request counted if admitted) and
when each window is empty again: OpenAI's `x-ratelimit-*` headers, sent with the request's
answer or its 429 without another round trip (`rate_limit_headers`).

Two ways to run the same check: `limits_admit` (sync: batches, and any thread) and
`limits_admit_async` (the web's event loop: Redis through its asyncio client, the ledger read
in a thread). Both build the script's arguments and read its verdict through `_Check`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from typing import Any

from django.conf import settings
from django.db.models import Sum
from redis.cluster import RedisCluster
from redis.commands.core import Script

from plumbing.aio_redis import AsyncRedis
from plumbing.errors import DomainError
from plumbing.redis import redis_client
from tenants.models import ApiKey, BudgetPeriod, Tenant, UsageRecord

log = logging.getLogger(__name__)

PREFIX = "gs:limits:"
WINDOW_S = 60

_ADMIT = """
-- KEYS[1]: the tenant's slot prefix (`tenant_slot`): every key the script touches starts
-- with it, so on Redis Cluster the call runs on the one primary that serves the tenant.
-- Numbers are converted once (`+ 0`; tonumber() converts a string twice), and given to Redis
-- as strings: Redis would format a Lua number again.
local slot = KEYS[1]
local now, rpm, tpm = ARGV[1] + 0, ARGV[2] + 0, ARGV[3] + 0
local tokens, budget, budget_key = ARGV[4] + 0, ARGV[5] + 0, ARGV[6]
local seeded = ARGV[7] == '1'
-- The key's own minute limits, where it has them ('' : none): counted beside its tenant's.
local key_id, key_rpm, key_tpm = ARGV[8] or '', (ARGV[9] or 0) + 0, (ARGV[10] or 0) + 0
local minute = math.floor(now / 60)
local overlap = 1 - (now - minute * 60) / 60
local this_minute = string.format('%d', minute)
local last_minute = string.format('%d', minute - 1)
-- Each window's count is read once: this minute's and the last one's, per kind and owner.
local counts = {}
local function read(owner, kind)
  local this = slot .. owner .. kind .. ':' .. this_minute
  local last = slot .. owner .. kind .. ':' .. last_minute
  local values = redis.call('MGET', this, last)
  return {key = this, this = (values[1] or 0) + 0, last = (values[2] or 0) + 0,
          new = not values[1]}
end
for _, kind in ipairs({'req', 'tok'}) do
  counts[kind] = read('', kind)
  if key_id ~= '' then counts['key' .. kind] = read('key:' .. key_id .. ':', kind) end
end
local function recent(kind)
  return counts[kind].this + counts[kind].last * overlap
end
local retry = math.ceil((minute + 1) * 60 - now)
local verdict = 'ok'
if rpm > 0 and recent('req') + 1 > rpm then verdict = 'rpm'
elseif tpm > 0 and recent('tok') + tokens > tpm then verdict = 'tpm'
elseif key_id ~= '' and key_rpm > 0 and recent('keyreq') + 1 > key_rpm then verdict = 'key_rpm'
elseif key_id ~= '' and key_tpm > 0 and recent('keytok') + tokens > key_tpm then
  verdict = 'key_tpm'
elseif budget > 0 then
  local used = redis.call('GET', budget_key)
  if not used and not seeded then return {'seed', 0} end
  if (used or 0) + tokens > budget then verdict = 'budget' end
end
if verdict == 'ok' then
  for kind, count in pairs(counts) do
    local req = kind == 'req' or kind == 'keyreq'
    count.this = redis.call('INCRBY', count.key, req and '1' or ARGV[4])
    -- A minute's counter lives three minutes from its first count (one script made it).
    if count.new then redis.call('EXPIRE', count.key, '180') end
  end
  if budget > 0 then redis.call('INCRBY', budget_key, ARGV[4]) end
end
-- What a minute limit leaves (this request counted if admitted), and in how many ms the
-- window holds nothing again: a minute's count weighs on until the end of the next one.
local function left(kind, limit)
  if limit <= 0 then return 0, 0 end
  local this, last = counts[kind].this, counts[kind].last
  local reset = 0
  if this > 0 then
    reset = (minute + 2) * 60 - now
  elseif last > 0 then
    reset = (minute + 1) * 60 - now
  end
  return math.max(0, math.floor(limit - this - last * overlap)), math.ceil(reset * 1000)
end
local requests_left, requests_reset = left('req', rpm)
local tokens_left, tokens_reset = left('tok', tpm)
if verdict == 'ok' or verdict == 'budget' then retry = 0 end
return {verdict, retry, requests_left, requests_reset, tokens_left, tokens_reset}
"""


# KEYS[i] is given back ARGV[i] tokens, never below zero (a negative refund is a charge:
# DECRBY of a negative amount adds it); a counter that is gone, its window over, stays gone.
_REFUND = """
for i, k in ipairs(KEYS) do
  if redis.call('EXISTS', k) == 1 then
    if redis.call('DECRBY', k, ARGV[i]) < 0 then redis.call('SET', k, 0, 'KEEPTTL') end
  end
end
"""


@cache
def _registered(url: str, source: str) -> Script:
    return redis_client().register_script(source)


def _script(source: str) -> Script:
    """The script registered once per Redis (called by SHA; reloaded if Redis forgot it)."""
    return _registered(settings.REDIS_URL, source)


class RateLimited(DomainError):
    http_status = 429
    error_type = "requests"
    code = "rate_limit_exceeded"


class BudgetExhausted(DomainError):
    http_status = 429
    error_type = "insufficient_quota"
    code = "insufficient_quota"


@dataclass(frozen=True)
class Admission:
    """What a request took from the limits, to settle when it ends."""

    tenant_id: int
    estimated_tokens: int
    minute: int
    budget_key: str | None
    # False when the tenant had no limits: nothing was counted, so nothing is refunded (one
    # round trip to Redis less per request).
    counted: bool = True
    # The key whose own minute limits counted it too (None: the key has none).
    api_key_id: int | None = None
    # The answer's x-ratelimit-* headers (`rate_limit_headers`): the web's to send, not part
    # of what is settled, so not in the job's payload (`settling_fields`).
    headers: dict[str, str] = field(default_factory=dict, compare=False)

    def settling_fields(self) -> dict[str, Any]:
        """What settling needs (`Admission(**fields)` again), for the job's payload."""
        return {name: value for name, value in vars(self).items() if name != "headers"}


def budget_period_start(period: str, now: datetime) -> datetime:
    if period == BudgetPeriod.DAY:
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def tenant_slot(tenant_id: int) -> str:
    """The prefix of every limits key of the tenant, its Redis Cluster hash tag included
    (`{t:<id>}`): one script call touches one slot, and a cluster runs it on the primary
    that serves it. Beneath it: `req:<minute>` and `tok:<minute>` (the tenant's counts per
    minute), `key:<id>:req:<minute>` and `key:<id>:tok:<minute>` (an API key's own), and
    `budget:<period start>` (tokens used in the budget's period)."""
    return f"{PREFIX}{{t:{tenant_id}}}:"


def _budget_key(tenant: Tenant, now: datetime) -> str:
    start = budget_period_start(tenant.budget_period, now)
    return f"{tenant_slot(tenant.pk)}budget:{start:%Y%m%d}"


@dataclass(frozen=True)
class _Check:
    """One request's check against its tenant's limits: the script's arguments, and what its
    answer means."""

    tenant: Tenant
    estimated_tokens: int
    moment: float
    budget_key: str | None
    api_key: ApiKey | None

    @classmethod
    def of(
        cls, tenant: Tenant, estimated_tokens: int, now: float | None, api_key: ApiKey | None
    ) -> _Check:
        moment = time.time() if now is None else now
        budget_key = None
        if tenant.token_budget:
            budget_key = _budget_key(tenant, datetime.fromtimestamp(moment, tz=UTC))
        limited_key = api_key if api_key is not None and api_key.has_limits else None
        return cls(tenant, estimated_tokens, moment, budget_key, limited_key)

    @property
    def limited(self) -> bool:
        """False for a tenant and key without limits: nothing to count, no round trip to
        Redis."""
        tenant = self.tenant
        return bool(tenant.rpm_limit or tenant.tpm_limit or tenant.token_budget or self.api_key)

    def args(self, *, seeded: bool) -> list[str | int]:
        """The script's arguments; `seeded`: the budget's counter was just seeded, so a
        missing one counts as zero rather than asking for a seed again."""
        tenant, key = self.tenant, self.api_key
        return [repr(self.moment), tenant.rpm_limit or 0,
                tenant.tpm_limit or 0, int(self.estimated_tokens), tenant.token_budget or 0,
                self.budget_key or "", "1" if seeded else "",
                key.pk if key else "", (key.rpm_limit or 0) if key else 0,
                (key.tpm_limit or 0) if key else 0]  # fmt: skip

    def seed(self) -> None:
        """The budget's counter from the ledger, where the script found none (Redis lost it,
        or the period is new): a database read, and the sync Redis client."""
        assert self.budget_key is not None  # only a budget asks for a seed
        tenant = self.tenant
        since = budget_period_start(
            tenant.budget_period, datetime.fromtimestamp(self.moment, tz=UTC)
        )
        used = UsageRecord.objects.filter(tenant=tenant, finished_at__gte=since).aggregate(
            tokens=Sum("prompt_tokens") + Sum("completion_tokens")
        )["tokens"]
        # NX: a concurrent seeder or a request that already counted wins.
        redis_client().set(self.budget_key, int(used or 0), nx=True, ex=40 * 24 * 3600)

    @staticmethod
    def wants_seed(answer: Sequence[Any]) -> bool:
        return _text(answer[0]) == "seed"

    def verdict(self, answer: Sequence[Any] | None) -> Admission:
        """What the request took from the limits, or RateLimited/BudgetExhausted; `answer`
        is the script's (None: not limited, nothing counted)."""
        tenant, estimated_tokens = self.tenant, self.estimated_tokens
        minute = math.floor(self.moment / WINDOW_S)
        if answer is None:
            return Admission(tenant.pk, estimated_tokens, minute, None, counted=False)
        verdict, retry_after = _text(answer[0]), int(answer[1])
        headers = rate_limit_headers(tenant.rpm_limit or 0, tenant.tpm_limit or 0, answer)
        if verdict == "rpm":
            raise _rate_limited(f"Rate limit reached: {tenant.rpm_limit} requests per minute.",
                                retry_after, headers)  # fmt: skip
        if verdict == "tpm":
            raise _rate_limited(
                f"Rate limit reached: {tenant.tpm_limit} tokens per minute; this request may "
                f"use up to {estimated_tokens}.",
                retry_after,
                headers,
            )
        key = self.api_key
        if key is not None and verdict == "key_rpm":
            raise _rate_limited(f"Rate limit of this key reached: {key.rpm_limit} requests per "
                                "minute.", retry_after, headers)  # fmt: skip
        if key is not None and verdict == "key_tpm":
            raise _rate_limited(
                f"Rate limit of this key reached: {key.tpm_limit} tokens per minute; this "
                f"request may use up to {estimated_tokens}.",
                retry_after,
                headers,
            )
        if verdict == "budget":
            raise BudgetExhausted(
                f"Token budget of {tenant.token_budget} per {tenant.budget_period} is used up.",
                headers=headers,
            )
        return Admission(
            tenant.pk,
            estimated_tokens,
            minute,
            self.budget_key,
            api_key_id=key.pk if key is not None else None,
            headers=headers,
        )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def limits_admit(
    *,
    tenant: Tenant,
    estimated_tokens: int,
    now: float | None = None,
    api_key: ApiKey | None = None,
) -> Admission:
    """Counts the request against the tenant's limits and its key's (`api_key`, where given),
    or raises RateLimited/BudgetExhausted."""
    check = _Check.of(tenant, estimated_tokens, now, api_key)
    if not check.limited:
        return check.verdict(None)
    script, slot = _script(_ADMIT), [tenant_slot(tenant.pk)]
    answer = script(keys=slot, args=check.args(seeded=False))
    if check.wants_seed(answer):
        check.seed()
        answer = script(keys=slot, args=check.args(seeded=True))
    return check.verdict(answer)


async def limits_admit_async(
    *,
    tenant: Tenant,
    estimated_tokens: int,
    client: AsyncRedis,
    in_thread: Callable[[Callable[[], None]], Awaitable[None]],
    now: float | None = None,
    api_key: ApiKey | None = None,
) -> Admission:
    """`limits_admit` from an event loop: the script through `client`, and the budget's seed
    (a read of the ledger, and the sync Redis client) through `in_thread`."""
    check = _Check.of(tenant, estimated_tokens, now, api_key)
    if not check.limited:
        return check.verdict(None)
    script, slot = _script(_ADMIT), tenant_slot(tenant.pk)
    answer = await client.evalsha(script.sha, _ADMIT, 1, slot, *check.args(seeded=False))
    if check.wants_seed(answer):
        await in_thread(check.seed)
        answer = await client.evalsha(script.sha, _ADMIT, 1, slot, *check.args(seeded=True))
    return check.verdict(answer)


def _rate_limited(message: str, retry_after: int, headers: dict[str, str]) -> RateLimited:
    return RateLimited(message, headers={"Retry-After": str(max(1, int(retry_after))), **headers})


def rate_limit_headers(rpm: int, tpm: int, answer: Sequence[Any]) -> dict[str, str]:
    """OpenAI's x-ratelimit-* headers from the admit script's answer, for the minute limits
    the tenant has (none: no headers): the limit, what is left of it, and when it is whole
    again."""
    headers: dict[str, str] = {}
    for kind, limit, left, reset_ms in (("requests", rpm, answer[2], answer[3]),
                                        ("tokens", tpm, answer[4], answer[5])):  # fmt: skip
        if limit:
            headers[f"x-ratelimit-limit-{kind}"] = str(limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(int(left))
            headers[f"x-ratelimit-reset-{kind}"] = duration_text(int(reset_ms))
    return headers


def duration_text(ms: int) -> str:
    """A duration as OpenAI's reset headers write it (Go's `time.Duration`): "0s", "120ms",
    "1s", "59.5s", "6m0s", "1h0m0s"."""
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1000)
    text = f"{seconds}.{millis:03d}".rstrip("0") if millis else str(seconds)
    if hours:
        return f"{hours}h{minutes}m{text}s"
    if minutes:
        return f"{minutes}m{text}s"
    return f"{text}s"


def limits_settle(*, admission: Admission, used_tokens: int, request_id: str = "") -> None:
    """Replaces the estimate with what the request really used (never below zero): what it
    did not use is given back, and what it used beyond the estimate (a prompt the engine
    counted longer than its bound) is charged too, so a tenant's tokens per minute and budget
    count the real tokens either way. `request_id`: the request's, for the log."""
    settling = _settling(admission, used_tokens, request_id)
    if settling is not None:
        keys, refund = settling
        _script(_REFUND)(keys=keys, args=[refund] * len(keys))


async def limits_settle_async(
    *, admission: Admission, used_tokens: int, client: AsyncRedis
) -> None:
    """`limits_settle` from an event loop, through `client`."""
    settling = _settling(admission, used_tokens)
    if settling is not None:
        keys, refund = settling
        await client.evalsha(_script(_REFUND).sha, _REFUND, len(keys), *keys, *[refund] * len(keys))


class Settlements:
    """A process's settlements of its requests' minute counters, summed per counter and
    written together by `flush`: a worker flushes them every half second
    (workers/dispatch.py, WATCH_S), in one round trip to Redis for all of them where each
    request cost one. A request's budget is settled at once (`add`): its counter stands for
    the period. Until a flush, and where one fails, the counters keep the requests'
    estimates, which only errs on the strict side (as a settle that fails)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # `add` and `flush` run on the worker's threads
        self._pending: dict[str, dict[str, int]] = {}  # tenant slot: {counter: refund}

    def add(self, *, admission: Admission, used_tokens: int, request_id: str = "") -> None:
        """`limits_settle`'s work, its minute counters' part kept for the next flush."""
        settling = _settling(admission, used_tokens, request_id)
        if settling is None:
            return
        keys, refund = settling
        if admission.budget_key:
            _script(_REFUND)(keys=[admission.budget_key], args=[refund])
            keys = [key for key in keys if key != admission.budget_key]
        with self._lock:
            counters = self._pending.setdefault(tenant_slot(admission.tenant_id), {})
            for key in keys:
                counters[key] = counters.get(key, 0) + refund

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def flush(self) -> int:
        """Writes what was added since the last flush; returns the counters written. A
        single Redis takes them in one call; a cluster, one call per tenant (each tenant's
        counters are in its own slot)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return 0
        refund = _script(_REFUND)
        batches = list(pending.values())
        if not isinstance(redis_client(), RedisCluster):
            batches = [{key: n for counters in batches for key, n in counters.items()}]
        written = 0
        for counters in batches:
            keys = [key for key, n in counters.items() if n]  # requests that used their estimate
            if keys:
                refund(keys=keys, args=[counters[key] for key in keys])
                written += len(keys)
        return written


# The worker's, for the requests it ran (workers/dispatch.py).
settlements = Settlements()


def _settling(
    admission: Admission, used_tokens: int, request_id: str = ""
) -> tuple[list[str], int] | None:
    """The counters to correct and by how much (given back when positive); None: nothing."""
    refund = admission.estimated_tokens - used_tokens
    if refund == 0 or not admission.counted:
        return None
    if refund < 0:
        log.warning(
            "request %s of tenant %s used %d tokens, %d more than admitted; charged",
            request_id or "-", admission.tenant_id, used_tokens, -refund,
        )  # fmt: skip
    slot = tenant_slot(admission.tenant_id)
    keys = [f"{slot}tok:{admission.minute}"]
    if admission.api_key_id is not None:
        keys.append(f"{slot}key:{admission.api_key_id}:tok:{admission.minute}")
    if admission.budget_key:
        keys.append(admission.budget_key)
    return keys, refund
