"""`FairQueue`: the scheduler's Python API over Redis.

Every operation that changes who runs next (enqueue, pick, release, cancel, requeue, reap,
expire, renew) is one Lua function of the fair queue's Redis Functions library
(`library.py`: `lua/lib.lua`'s shared helpers, then one function per script file), called
with FCALL; a Redis that lost the library (a restart without persistence) ran nothing and
gets it loaded before the call is made again. Time is Redis's own clock
(TIME inside the script), so hosts whose clocks differ still agree on leases and deadlines;
tests pass `now` (seconds) to drive the clock.

Pick rule (details in `lua/pick.lua`, pure reference in `model.py`):
- classes: stride scheduling on a class virtual time per pool; the chosen class advances by
  1/class_weight, classes with nothing admissible are lifted to the chosen one's time so they
  do not bank credit; offline is skipped while its gate is shut (`lua/lib.lua` offline_gate:
  online seats or the samplers' load at the threshold, or no seat left beyond the reserve).
- tenants in a class: least VTC counter first among backlogged tenants whose head job is
  admissible. At pick the counter is charged the estimate (prompt + 2 x max_tokens)/weight:
  an upper bound, so a tenant cannot grab many dispatches while its earlier jobs are still
  running and uncharged; release replaces it with (prompt + 2 x completion)/weight.
  A tenant that becomes backlogged is lifted to the least backlogged counter (or, when none
  is backlogged, to the counter of the last tenant that left), so idle time is not credit.
- admission: cost <= engine free KV bytes; engine in-flight < max_num_seqs + queued (its
  seats and its own waiting queue); tenant held + cost <= quota, or <= quota + burst
  while the engine has idle capacity: no waiting job of the pool (in a class open on this
  engine) that this engine could run within its tenant's quota. Borrowed burst is not
  pre-empted; it returns when the job ends. `held` is what the tenant's jobs hold in the
  pool, bounded by the tenant's quota lease there as well (`leases.py`): where the lease
  alone holds a job back, the pick says so, the lease is asked for and the pick made again
  (`pick`, `grow_lease`; docs/decisions/0020-picks-admit-against-the-pools-quota-lease.md).

Worker protocol: `pick` -> run -> `renew_lease(job_id, attempt)` every lease/3 or so (False
means the job was cancelled or reaped: stop) -> `release(job_id, prompt, completion,
attempt=...)`; or `requeue(job_id, attempt=...)` to give it back. A worker that goes on to
its next job calls `release_and_pick` instead: the release and the next pick in one round
trip. Passing `attempt` makes a stale worker (whose lease was reaped and whose job runs again
elsewhere) harmless: its release, renew and requeue are no-ops. A pick on an unknown engine,
or on an engine of another pool, raises redis.ResponseError.

Known limits: a job larger than the engine's free KV budget is passed over for smaller ones
behind it (no reservation ahead for big jobs), so under constant small-job pressure a big
job can wait until its queue timeout; its tenant's low counter puts it first whenever room
appears. Cancelling a running job charges its prompt only (its output is unknown here).

Waiter notification: each job has an event list (`Keys.events`). The scheduler appends
JSON events ``requeued``, ``expired`` (reason ``queue_timeout``) and ``cancelled``; the
worker appends its run's through `publish` (chunks, ``done``, ``error``, each with the run's
`attempt`, which tells a requeued run's leftovers apart). A pick tells the waiter nothing:
it would cost the waiter a round trip per request to learn what the run's first words say.
The waiting view reads them in order with `wait_event` (BLPOP), so nothing is lost between
subscribe and publish as it could be with pub/sub.

Fencing (`FairQueueConfig.replicas_ack` > 0, under Redis Sentinel): the scripts that decide
who runs what and what a waiter or the ledger hears (`FENCED_SCRIPTS`) are followed by
`WAIT replicas timeout_ms` on the same connection, in the same round trip where the client
allows (`plumbing/sentinel.py` Fence). A call that fewer replicas acknowledged raises
NotReplicated (a redis ConnectionError) with the script's answer: a promoted replica may
lack the write, so its answer is not acted on as it stands (`aio.py` says what the worker
and the web do instead; docs/decisions/0013-fence-the-fair-queue-with-wait.md).
"""

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster

from fairqueue import library
from fairqueue.domain import (
    BOUNDED_CLASSES,
    CheckReport,
    DispatchLoop,
    EnginePolicy,
    FairQueueConfig,
    Job,
    JobRejected,
    LeaseWant,
    QueueRow,
    Snapshot,
    TenantPolicy,
)
from fairqueue.inbox import chunk_entry, event_entry
from fairqueue.keys import Keys, check_id, check_tag
from fairqueue.leases import Leases
from fairqueue.reservations import EngineReservation, engine_reservation
from fairqueue.seats import EngineSeats, engine_seats
from plumbing import wire
from plumbing.raw_redis import RawRedis
from plumbing.sentinel import NO_FENCE, Fence, NotReplicated
from protocol.classes import REQUEST_CLASSES

# An idle loop's wait is cut in slices this long at most (and at most half its registration).
WAIT_SLICE_S = 2.0
# A seat controller's state in its engine's hash, per class (lua/lib.lua `observe_ttft`).
CONTROLLER_FIELDS = ("below", "cut", "sampled")
# The functions whose writes a caller acts on (a job queued, picked and run, released with
# its answer and its ledger row, given back, cancelled, a granted stream's report): under
# fencing their answer stands only once replicas acknowledged them.
FENCED_SCRIPTS = frozenset(
    {"enqueue", "pick", "release", "release_pick", "requeue", "cancel", "answer"}
)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# A pick's last argument (lua/pick.lua): whether it may ask for a tenant's lease.
ASK_LEASE, NO_ASK = "1", ""
# The most leases one pick asks for before it picks without asking (each tenant asks at most
# once a second in a pool where its ask was not granted: lua/lib.lua pick_on).
MAX_ASKS = 8


# A picked job's fields, in the order a pick answers them after the job's id and whether
# its worker summons the next loop (lua/lib.lua PICK_FIELDS).
PICK_FIELDS = (
    *("tenant", "pool", "cls", "prompt_tokens", "max_tokens", "kv_bytes", "payload", "state"),
    *("enqueued_at", "deadline", "engine", "attempt", "lease_deadline", "charged", "reason"),
    *("answered", "seqs", "stamp", "reserved", "kv_floor", "kv_token", "affinity", "observed"),
)


def _picked(answer: Any, loop: DispatchLoop | None, pool: str) -> Job | LeaseWant:
    """A pick's job (lua/lib.lua pick_reply: its id, '1' where its worker summons the next
    loop, its PICK_FIELDS; none where it has none), or what a lease wants (JSON)."""
    if not isinstance(answer, list):
        return LeaseWant.from_fields(pool, wire.loads(_text(answer))["want"])
    job_id, summon, *values = answer
    if loop is not None:
        loop.summon_next = _text(summon) == "1"
    fields = {
        name: _text(value)
        for name, value in zip(PICK_FIELDS, values, strict=True)
        if value is not None
    }
    return Job.from_hash(_text(job_id), fields)


@dataclass(frozen=True)
class LastWords:
    """What a run leaves when it ends, told in the step that releases it rather than in
    round trips of their own: its final event for the waiter (as `publish` would append it)
    and an entry for an outbox list the queue does not own (the usage ledger's pending
    rows)."""

    event: Mapping[str, Any] | None = None
    outbox: str = ""
    entry: str = ""
    # Its time to first token in seconds, from its request's arrival, for the seat
    # controller of its class on its engine; None: it gave no token.
    ttft_s: float | None = None

    def args(self) -> list[str]:
        event = "" if self.event is None else wire.dumps(dict(self.event))
        ttft = "" if self.ttft_s is None else repr(max(0.0, float(self.ttft_s)))
        return [event, self.outbox, self.entry, ttft]


NO_LAST_WORDS = LastWords()


def release_args(
    job_id: str,
    prompt_tokens: int,
    completion_tokens: int,
    attempt: int | None,
    last_words: LastWords | None,
) -> list[Any]:
    stamp = "" if attempt is None else str(attempt)
    # Whole numbers as int() writes them: the script stores them as they come.
    tokens = (int(prompt_tokens), int(completion_tokens))
    return [job_id, *tokens, stamp, *(last_words or NO_LAST_WORDS).args()]


def pick_answer(answer: Any, loop: DispatchLoop | None, pool: str) -> Job | LeaseWant | None:
    """A pick's job, None, or (a pick that may ask) what a tenant's lease should grow by."""
    return _picked(answer, loop, pool) if answer else None


def release_pick_answer(
    answer: Any, loop: DispatchLoop | None, pool: str
) -> tuple[bool, Job | LeaseWant | None]:
    released, picked = answer
    return bool(released), pick_answer(picked, loop, pool)


def starved_entry(tenant: str, pool: str) -> str:
    """A member of `Keys.lease_starved` (tenant ids hold no spaces)."""
    return f"{tenant} {pool}"


class FairQueue:
    def __init__(self, client: redis.Redis, config: FairQueueConfig | None = None) -> None:
        self.redis = client
        self.config = config or FairQueueConfig()
        self.keys = Keys(self.config.prefix)
        # The script calls, loops' waits and events go over lean connections of their own
        # where the client's kind of connection allows (raw_redis.py beside this file).
        self._raw = RawRedis.like(client)
        self.fence = Fence(self.config.replicas_ack, self.config.replicas_ack_timeout_ms)
        self.leases = Leases(client, self.config.prefix)

    # --- policies (written by the platform from its database) ----------------------------

    def set_tenant_policy(self, tenant: str, policy: TenantPolicy) -> None:
        """Writes the tenant's policy, and its copy in every pool (a pool's decisions read
        their pool's copy: one slot; `set_engine_policy` copies them into a pool that gets
        its first engine)."""
        check_id("tenant", tenant)
        fields: dict[Any, Any] = {
            "weight": repr(float(policy.weight)),
            "quota_bytes": policy.quota_bytes,
            "burst_bytes": policy.burst_bytes,
        }
        was = self.leases.tenant_slot(tenant)
        pipe = self.redis.pipeline()
        pipe.hset(self.keys.tenant_policy(tenant), mapping=fields)
        for pool in self.pools():
            pipe.hset(self.keys.tenant(pool, tenant), mapping=fields)
        pipe.sadd(self.keys.tenants(), tenant)
        pipe.execute()
        # The tenant's slot of the quota leases: a pool is leased what it asks for within it.
        # A lowered quota or burst takes back what the pools lease beyond what they hold (a
        # pool's picks count against its copy of the policy at once, and its lease).
        self.leases.set_policy(tenant, policy.quota_bytes, policy.burst_bytes)
        if policy.quota_bytes < was.quota or policy.burst_bytes < was.burst:
            self.leases.give_back_unused(tenant)

    def pools(self) -> list[str]:
        """The pools that ever had an engine, by name."""
        return sorted(_text(p) for p in self.redis.smembers(self.keys.pools()))

    def engine_pool(self, engine_id: str) -> str | None:
        """The pool the engine serves now (None: none), from the pools' engine sets."""
        pools = self.pools()
        pipe = self.redis.pipeline(transaction=False)
        for pool in pools:
            pipe.sismember(self.keys.pool_engines(pool), engine_id)
        return next((p for p, found in zip(pools, pipe.execute(), strict=True) if found), None)

    def _copy_tenant_policies(self, pool: str) -> None:
        """Every tenant's policy copied into the pool's slot (see `set_tenant_policy`)."""
        tenants = sorted(_text(t) for t in self.redis.smembers(self.keys.tenants()))
        pipe = self.redis.pipeline(transaction=False)
        for tenant in tenants:
            pipe.hgetall(self.keys.tenant_policy(tenant))
        policies = pipe.execute()
        for tenant, fields in zip(tenants, policies, strict=True):
            if fields:
                pipe.hset(self.keys.tenant(pool, tenant), mapping=fields)
        pipe.execute()

    def set_engine_policy(self, policy: EnginePolicy) -> None:
        """Writes the engine's policy in its pool. An engine that changes pool leaves the
        one it served (as `remove_engine`: its in-flight jobs still release there) and joins
        the new one afresh."""
        check_id("engine", policy.engine_id)
        pool = check_tag("pool", policy.pool)
        previous = self.engine_pool(policy.engine_id)
        if previous is not None and previous != pool:
            self._leave_pool(previous, policy.engine_id)
        if previous != pool:
            # An engine new to the pool (its first one among them): the tenants' policies
            # are copied in before the pool takes a job, which needs an engine.
            self._copy_tenant_policies(pool)
        key = self.keys.engine(pool, policy.engine_id)
        names = [f"target:{c}" for c in BOUNDED_CLASSES]
        targets = self.redis.hmget(key, names)
        pipe = self.redis.pipeline()
        bounds: dict[str, str] = {}  # the bounds set, as the engine's hash holds them
        for request_class, was in zip(BOUNDED_CLASSES, targets, strict=True):
            target = policy.ttft_targets_s.get(request_class)
            if target is not None:
                bounds[f"target:{request_class}"] = repr(float(target))
            fixed = policy.fixed_seats_below.get(request_class)
            if fixed is not None:
                bounds[f"fixed:{request_class}"] = str(int(fixed))
            if was is None or target is None or float(was) != target:
                # A new target starts its controller afresh: the bound it held was for another.
                pipe.hdel(key, *(f"{f}:{request_class}" for f in CONTROLLER_FIELDS))
                pipe.delete(self.keys.engine_ttfts(pool, policy.engine_id, request_class))
        stale = [f"{kind}:{c}" for kind in ("target", "fixed") for c in BOUNDED_CLASSES]
        if unset := [name for name in stale if name not in bounds]:
            pipe.hdel(key, *unset)
        controller = policy.seat_controller
        fields: dict[Any, Any] = {
            **bounds,
            "target_quantile": repr(controller.quantile),
            "target_step": repr(controller.step),
            "target_idle_s": repr(controller.idle_s),
            "pool": pool,
            "kv_budget_bytes": policy.kv_budget_bytes,
            "max_num_seqs": policy.max_num_seqs,
            "queued": policy.queued,
            "offline_load_threshold": repr(float(policy.offline_load_threshold)),
            "offline_gate_margin": repr(float(policy.offline_gate_margin)),
            "offline_reserve": policy.offline_reserve,
            "load": repr(float(policy.load)),
            "reservation": policy.reservation,
            "out_quantile": repr(float(policy.output_quantile)),
        }
        pipe.hset(key, mapping=fields)
        pipe.sadd(self.keys.engines(), policy.engine_id)
        pipe.sadd(self.keys.pool_engines(pool), policy.engine_id)
        pipe.sadd(self.keys.pools(), pool)
        pipe.execute()
        self._run("pool_shape", pool, pool)

    def set_engine_load(
        self,
        pool: str,
        engine_id: str,
        load: float,
        signal: str = "",
        *,
        kv_usage: float | None = None,
        preempted: float | None = None,
        now: float | None = None,
    ) -> bool:
        """Writes the samplers' load of an engine of `pool`, and which signal it came from;
        moves the offline gate's hysteresis (`lua/set_load.lua`). `kv_usage` (0..1), the
        engine's own measure of its KV in use, and `preempted`, the requests it preempted
        since the last reading, steer the `predict` mode's admission (None: not known).
        Returns whether the load holds the gate shut now."""
        check_id("engine", engine_id)
        measures = ["" if v is None else repr(float(v)) for v in (kv_usage, preempted)]
        args = [engine_id, repr(float(load)), signal, *measures]
        return bool(self._run("set_load", pool, *args, now=now))

    def grow(
        self, pool: str, job_id: str, attempt: int, tokens: int, *, now: float | None = None
    ) -> int:
        """A running job generated `tokens` (its sequences together): its reservation grows
        when they pass what it covers (`lua/grow.lua`). Returns the tokens it covers now; -1
        when it reserves its worst case, -2 when the job is not this attempt's any more."""
        return int(self._run("grow", pool, job_id, attempt, int(tokens), now=now))

    def remove_engine(self, engine_id: str) -> None:
        """No new picks for the engine; its in-flight jobs still release normally."""
        pool = self.engine_pool(engine_id)
        if pool is not None:
            self._leave_pool(pool, engine_id)

    def _leave_pool(self, pool: str, engine_id: str) -> None:
        """The engine takes no more of the pool's jobs; its usage stays for its in-flight
        jobs' releases."""
        pipe = self.redis.pipeline()
        pipe.srem(self.keys.pool_engines(pool), engine_id)
        pipe.delete(self.keys.engine(pool, engine_id))
        pipe.execute()
        self._run("pool_shape", pool, pool)

    # --- the decisions --------------------------------------------------------------------

    def script_head(self, now: float | None = None) -> list[str | int]:
        """The arguments every script takes first: the keys' prefix, the moment ('' = Redis's
        clock) and how long finished jobs are kept."""
        moment = "" if now is None else repr(float(now))
        return [self.config.prefix, moment, self.config.keep_s]

    def load_library(self) -> None:
        """Loads the scripts' library into Redis, unless it is there already."""
        try:
            self.redis.function_load(library.library_source())
        except redis.exceptions.ResponseError as error:
            if not library.is_loaded_already(error):
                raise

    def fence_for(self, name: str) -> Fence:
        """What a call of script `name` waits for behind it (see the module's docstring)."""
        return self.fence if name in FENCED_SCRIPTS else NO_FENCE

    def call_head(self, name: str, pool: str, now: float | None = None) -> list[Any]:
        """FCALL of script `name` for `pool` up to its arguments: the function, its one key
        (the pool's tag prefix: a cluster routes the call to the pool's slot) and
        `script_head`."""
        return ["FCALL", library.function_name(name), 1, self.keys.pool_tag(pool),
                *self.script_head(now)]  # fmt: skip

    def _run(self, name: str, pool: str, *args: Any, now: float | None = None) -> Any:
        call = (*self.call_head(name, pool, now), *args)
        fence = self.fence_for(name)
        try:
            return self._call(call, fence)
        except redis.exceptions.ResponseError as error:
            if not library.is_missing(error):
                raise
        self.load_library()  # Redis ran nothing: it did not know the function
        return self._call(call, fence)

    def _call(self, command: tuple[Any, ...], fence: Fence = NO_FENCE) -> Any:
        if self._raw is None:
            if fence:
                return self._fenced(command, fence)
            return self.redis.execute_command(*command)
        return self._raw.call(*command, fence=fence)

    def _fenced(self, command: tuple[Any, ...], fence: Fence) -> Any:
        """A call and its fence's WAIT in one redis-py pipeline: one connection, so the WAIT
        counts the replicas that have the call's writes."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.execute_command(*command)
        if isinstance(self.redis, RedisCluster):  # the WAIT goes where the call's key went
            node = self.redis.get_node_from_key(command[3])
            pipe.execute_command(*fence.command(), target_nodes=node)
        else:
            pipe.execute_command(*fence.command())
        answer, acked = pipe.execute()
        return fence.check(answer, acked)

    def enqueue(
        self,
        *,
        tenant: str,
        pool: str,
        request_class: str,
        prompt_tokens: int,
        max_tokens: int,
        kv_bytes: int,
        payload: str = "",
        job_id: str | None = None,
        now: float | None = None,
        summary: str = "",
        seqs: int = 1,
        kv_floor: int | None = None,
        kv_token: int = 0,
        observed: bool = False,
        affinity: str = "",
    ) -> Job:
        """Queues a job at the tail of its tenant's queue; raises JobRejected when it can
        never run (larger than every engine of the pool or than the tenant's quota + burst,
        unknown tenant, no engine, duplicate id)."""
        job, _ = self._enqueue(
            summon=False, tenant=tenant, pool=pool, request_class=request_class,
            prompt_tokens=prompt_tokens, max_tokens=max_tokens, kv_bytes=kv_bytes,
            payload=payload, job_id=job_id, now=now, summary=summary, seqs=seqs,
            kv_floor=kv_floor, kv_token=kv_token, observed=observed, affinity=affinity,
        )  # fmt: skip
        return job

    def enqueue_summoning(self, **fields: Any) -> tuple[Job, bool]:
        """`enqueue` that also sees the job get a worker: it wakes an idle dispatch loop of
        the pool, else returns True when the caller must summon one (send a dispatch task);
        False also when a loop summoned a moment ago has yet to start (it fans out)."""
        return self._enqueue(summon=True, **fields)

    def _enqueue(
        self, *, summon: bool, now: float | None = None, **fields: Any
    ) -> tuple[Job, bool]:
        args = self.enqueue_args(summon=summon, **fields)
        return self.enqueue_answer(self._run("enqueue", args[2], *args, now=now), args)

    def enqueue_args(
        self,
        *,
        summon: bool,
        tenant: str,
        pool: str,
        request_class: str,
        prompt_tokens: int,
        max_tokens: int,
        kv_bytes: int,
        payload: str = "",
        job_id: str | None = None,
        inbox: str = "",
        max_waiting: int = 0,
        summary: str = "",
        seqs: int = 1,
        kv_floor: int | None = None,
        kv_token: int = 0,
        observed: bool = False,
        affinity: str = "",
    ) -> list[Any]:
        """The enqueue script's arguments (after `script_head`), checked. `inbox`: the list
        its waiter reads the events of all its jobs from (see `Keys.inbox`); '' = the job's
        own event list. `max_waiting`: the job is refused (`too_many_waiting`) when that many
        of its tenant's jobs already wait in the pool's queues; 0 = no limit. `summary`: what
        the job keeps in place of its payload once it is over (`payload_summary`); '' = all.
        `seqs`: the sequences it runs (n samples of each prompt), one engine seat each.
        `kv_floor`, `kv_token`, `observed`: what a prediction of its KV is made of where its
        engine predicts (`lua/lib.lua` job_cost): the bytes of its prompts with a block of
        output per sequence (None: `kv_bytes`), the bytes per token generated (0: it always
        reserves `kv_bytes`), and whether its tokens are counted as they come (it can grow).
        `affinity`: whose prefixes it shares (`Job.affinity`); '' = none."""
        if request_class not in REQUEST_CLASSES:
            raise JobRejected("unknown_class", f"unknown request class {request_class!r}")
        if min(prompt_tokens, max_tokens, kv_bytes) < 0:
            raise ValueError("token counts and KV bytes cannot be negative")
        if seqs < 1:
            raise ValueError("a job runs at least one sequence")
        floor = kv_bytes if kv_floor is None else min(kv_floor, kv_bytes)
        if min(floor, kv_token) < 0:
            raise ValueError("KV bytes cannot be negative")
        job_id = check_id("job", job_id or uuid.uuid4().hex)
        check_id("tenant", tenant)
        check_tag("pool", pool)
        timeout = repr(float(self.config.queue_timeouts_s[request_class]))
        # Whole numbers as int() writes them: the script stores them as they come.
        return [
            *(job_id, tenant, pool, request_class, int(prompt_tokens), int(max_tokens)),
            int(kv_bytes),
            *(timeout, payload, str(self.config.loop_summon_s) if summon else "", inbox),
            int(max_waiting),
            summary,
            int(seqs),
            int(floor),
            int(kv_token),
            "1" if observed else "",
            affinity,
        ]

    @staticmethod
    def enqueue_answer(answer: Any, args: list[Any]) -> tuple[Job, bool]:
        """The queued job (and whether a loop must be summoned) from the enqueue script's
        answer to `args`; JobRejected when it refused the job."""
        status = [_text(part) for part in answer]
        if status[0] != "ok":
            raise JobRejected(status[1], status[2])
        job_id, tenant, pool, request_class, prompt_tokens, max_tokens, kv_bytes = args[:7]
        job = Job(
            job_id=job_id,
            tenant=tenant,
            pool=pool,
            request_class=request_class,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            kv_bytes=kv_bytes,
            payload=args[8],
            enqueued_at=float(status[1]),
            deadline=float(status[2]),
            seqs=int(args[13]),
            affinity=args[17],
        )
        return job, status[3] == "summon"

    def pick(
        self,
        pool: str,
        engine_id: str = "",
        *,
        loop: DispatchLoop | None = None,
        now: float | None = None,
    ) -> Job | None:
        """The fairest admissible job of `pool`, reserved and leased to the caller, or None
        when nothing may run now. For `engine_id`, or (empty) for the pool's engine with the
        most free KV (ties: fewest in flight) that can run one. A dispatch `loop` that gets
        None is registered idle: it waits for work with `wait_for_work`. Where a tenant's
        lease in the pool holds its fairest job back, the lease is asked for and the pick
        made again (`grow_lease`)."""
        starting = loop is not None and loop.starting
        picked = self._pick_once(pool, engine_id, loop, ASK_LEASE, now)
        return self.pick_after_asking(picked, loop=loop, starting=starting, now=now)

    def _pick_once(
        self, pool: str, engine_id: str, loop: DispatchLoop | None, ask: str, now: float | None
    ) -> Job | LeaseWant | None:
        args = self.pick_args(pool, engine_id, loop)
        try:
            answer = self._run("pick", pool, *args, ask, now=now)
        except NotReplicated as short:  # a want decided nothing: it needs no replica
            if not isinstance(pick_answer(short.answer, loop, pool), LeaseWant):
                raise
            answer = short.answer
        return pick_answer(answer, loop, pool)

    def pick_after_asking(
        self,
        picked: Job | LeaseWant | None,
        *,
        loop: DispatchLoop | None = None,
        starting: bool = False,
        now: float | None = None,
    ) -> Job | None:
        """A pick's answer once the leases it wanted were asked for (`grow_lease`), each
        followed by the pick again: a tenant whose lease a grant did not bring up is passed
        over then (it asked a moment ago), and the next tenant may ask in turn; past
        MAX_ASKS the pick asks no more. A loop `starting` still fans out from the pick."""
        asks = 0
        while isinstance(picked, LeaseWant):
            self.grow_lease(picked)
            asks += 1
            if loop is not None:
                loop.starting = starting
            ask = ASK_LEASE if asks < MAX_ASKS else NO_ASK
            picked = self._pick_once(picked.pool, picked.engine, loop, ask, now)
        return picked

    def grow_lease(self, want: LeaseWant) -> bool:
        """Asks the tenant's slot for the lease a pick wanted (as much as `TenantSlot.ask`
        says, from what the slot leases now) and applies the grant in the pool (three calls:
        two in the tenant's slot, one in the pool's). A pool granted less than the job needs
        is recorded
        starved: housekeeping then brings the tenant's unused leases back from its other
        pools (`rebalance_leases`). Returns whether a grant was applied."""
        slot = self.leases.tenant_slot(want.tenant)
        asked = slot.ask(want.pool, want=want.want, need=want.need, idle=want.idle)
        grant = self.leases.grant(want.tenant, want.pool, asked, idle=want.idle)
        applied = self.leases.apply(grant)
        if not applied or grant.granted < want.need:
            self.redis.sadd(self.keys.lease_starved(), starved_entry(want.tenant, want.pool))
        return applied

    def rebalance_leases(self) -> list[str]:
        """Housekeeping's turn for the tenants a pool asked for and got too little: each
        of their pools gives back what it leases beyond what their jobs hold there, so the
        pool's next ask is granted it; that pool may ask again at once. Returns the pools
        that asked (housekeeping kicks those with waiting work)."""
        starved = self.keys.lease_starved()
        entries = sorted(_text(e) for e in self.redis.smembers(starved))
        if entries:
            self.redis.srem(starved, *entries)  # first: a pool that asks again is recorded
        pools: set[str] = set()
        for tenant in sorted({entry.split(" ", 1)[0] for entry in entries}):
            self.leases.give_back_unused(tenant)
        for entry in entries:
            tenant, pool = entry.split(" ", 1)
            self.redis.hdel(self.keys.lease(pool, tenant), "asked_at")
            pools.add(pool)
        return sorted(pools)

    def release(
        self,
        pool: str,
        job_id: str,
        prompt_tokens: int,
        completion_tokens: int,
        *,
        attempt: int | None = None,
        now: float | None = None,
        last_words: LastWords | None = None,
    ) -> bool:
        """The job ended: frees its reservation and charges the real tokens. Idempotent:
        False (and nothing changed) when the job is not running, or not as `attempt`.
        `last_words` are told in the same step, released or not."""
        args = release_args(job_id, prompt_tokens, completion_tokens, attempt, last_words)
        return bool(self._run("release", pool, *args, now=now))

    def release_and_pick(
        self,
        job: Job,
        prompt_tokens: int,
        completion_tokens: int,
        *,
        pool: str,
        engine_id: str = "",
        loop: DispatchLoop | None = None,
        now: float | None = None,
        last_words: LastWords | None = None,
        same_engine: bool = False,
    ) -> tuple[bool, Job | None]:
        """A worker's turn in one atomic step (one round trip): `release` of the job it ran
        (as its attempt, telling its `last_words`), then `pick` of its next one. Returns
        (released, next job). `same_engine`: the next job is picked for the engine the
        released one ran on, the one place where room appeared (`engine_id` is then
        unused; see lua/release_pick.lua)."""
        starting = loop is not None and loop.starting
        args = self.release_pick_args(
            job, prompt_tokens, completion_tokens, pool, engine_id, loop, last_words,
            same_engine,
        )  # fmt: skip
        answer = self._run("release_pick", pool, *args, now=now)
        released, picked = release_pick_answer(answer, loop, pool)
        return released, self.pick_after_asking(picked, loop=loop, starting=starting, now=now)

    def release_pick_args(
        self,
        job: Job,
        prompt_tokens: int,
        completion_tokens: int,
        pool: str,
        engine_id: str,
        loop: DispatchLoop | None,
        last_words: LastWords | None,
        same_engine: bool = False,
    ) -> list[Any]:
        return [
            *(job.job_id, prompt_tokens, completion_tokens, str(job.attempt)),
            *self.pick_args(pool, engine_id, loop),
            *(last_words or NO_LAST_WORDS).args(),
            "1" if same_engine else "",
        ]

    def pick_args(self, pool: str, engine_id: str, loop: DispatchLoop | None) -> list[str]:
        lease = repr(float(self.config.lease_s))
        args = [pool, engine_id, lease, *map(repr, self.config.weight_args())]
        if loop is None:
            return [*args, "", "0", "", "0"]
        starting = "1" if loop.starting else ""
        loop.starting = False
        idle, summon = repr(float(self.config.loop_idle_s)), str(self.config.loop_summon_s)
        return [*args, loop.token, idle, starting, summon]

    def wait_for_work(
        self,
        pool: str,
        loop: DispatchLoop,
        timeout_s: float,
        *,
        stop: threading.Event | None = None,
    ) -> bool:
        """An idle loop (its pick got None) waits up to `timeout_s` to be woken by new work
        or a freed seat, or until `stop` is set. True: woken, pick again. False: nothing
        came; the loop is no longer idle.

        It waits in slices (each BLPOP answered well within the client's read timeout), and
        each slice renews its idle registration for `loop_idle_s` in the same round trip, so
        a loop that dies waiting is forgotten within seconds rather than woken for nothing.
        A registration already gone (the loop stalled past it) ends the wait."""
        idle = self.keys.idle_loops(pool)
        wake = self.keys.loop_wake(pool, loop.token)
        waits_until = time.monotonic() + timeout_s
        while stop is None or not stop.is_set():
            left = waits_until - time.monotonic()
            if left <= 0:
                break
            slice_s = self.wait_slice_s(left)
            try:
                renewed, woken = self._renew_and_wait(idle, wake, loop.token, slice_s)
            except redis.TimeoutError:  # the client's read timeout, on a stalled machine
                continue
            if woken is not None:
                return True
            if not renewed:
                break
        return self.stop_waiting(pool, loop)

    def _renew_and_wait(self, idle: str, wake: str, token: str, slice_s: float) -> list[Any]:
        """One round trip: the loop's idle registration renewed (XX: never re-registered
        once a waker has taken it, its wake being on the list), then BLPOP on its wake list."""
        if self._raw is None:
            until = time.time() + self.config.loop_idle_s
            pipe = self.redis.pipeline(transaction=False)
            pipe.zadd(idle, {token: until}, xx=True, ch=True)
            pipe.blpop([wake], timeout=slice_s)
            return pipe.execute()
        return self._raw.pipeline(
            self.renew_and_wait_commands(idle, wake, token, slice_s), block_s=slice_s
        )

    def renew_and_wait_commands(
        self, idle: str, wake: str, token: str, slice_s: float
    ) -> list[tuple[str, ...]]:
        """An idle loop's registration renewed (XX: never re-registered once a waker has
        taken it, its wake being on the list), then BLPOP on its wake list."""
        until = repr(time.time() + self.config.loop_idle_s)
        return [("ZADD", idle, "XX", "CH", until, token), ("BLPOP", wake, repr(slice_s))]

    def wait_slice_s(self, left_s: float) -> float:
        """How long one slice of an idle loop's wait lasts (see `wait_for_work`)."""
        return min(WAIT_SLICE_S, self.config.loop_idle_s / 2, left_s)

    def stop_waiting(self, pool: str, loop: DispatchLoop) -> bool:
        """An idle loop leaves; True when it was woken meanwhile (its work needs a loop)."""
        return bool(self._run("stop_waiting", pool, pool, loop.token))

    def kick(self, pool: str) -> bool:
        """Nudges the pool's dispatch loops (its waiting work may have missed its loop):
        wakes an idle one; True when none is idle and the caller must summon one."""
        return _text(self._run("kick", pool, pool, str(self.config.loop_summon_s))) == "summon"

    def renew_lease(self, pool: str, job_id: str, attempt: int, now: float | None = None) -> bool:
        """Extends the lease; False means the job is no longer the caller's: stop running it."""
        return bool(self._run("renew", pool, *self.renew_args(job_id, attempt), now=now))

    def renew_args(self, job_id: str, attempt: int) -> list[Any]:
        return [job_id, str(attempt), repr(float(self.config.lease_s))]

    def cancel(
        self, pool: str, job_id: str, reason: str = "cancelled", now: float | None = None
    ) -> str:
        """Cancels a queued or running job; returns the state it was in, '' if neither."""
        return _text(self._run("cancel", pool, job_id, reason, now=now))

    def requeue(
        self,
        pool: str,
        job_id: str,
        *,
        attempt: int | None = None,
        reason: str = "requeued",
        now: float | None = None,
    ) -> bool:
        """Gives a running job back to the head of its queue (e.g. its engine went away)."""
        args = self.requeue_args(job_id, attempt, reason)
        return bool(self._run("requeue", pool, *args, now=now))

    def requeue_args(self, job_id: str, attempt: int | None, reason: str) -> list[Any]:
        stamp = "" if attempt is None else str(attempt)
        return [job_id, stamp, reason, *map(repr, self.config.timeout_args())]

    def reap_expired_leases(
        self, now: float | None = None, limit: int = 100, *, pool: str | None = None
    ) -> list[str]:
        """Running jobs whose lease ended go back to their queues: of `pool`, or (None) of
        every pool, at most `limit` per pool. Returns their ids."""
        timeouts = [repr(t) for t in self.config.timeout_args()]
        return self._per_pool("reap", pool, [limit, *timeouts], now)

    def expire_waiting(
        self, now: float | None = None, limit: int = 100, *, pool: str | None = None
    ) -> list[str]:
        """Queued jobs past their queue deadline end, their waiters told: of `pool`, or
        (None) of every pool, at most `limit` per pool. Returns their ids."""
        return self._per_pool("expire", pool, [limit], now)

    def _per_pool(
        self, name: str, pool: str | None, args: list[Any], now: float | None
    ) -> list[str]:
        pools = self.pools() if pool is None else [pool]
        return [_text(job) for p in pools for job in self._run(name, p, *args, now=now)]

    # --- the waiter's channel ---------------------------------------------------------------

    def publish(self, pool: str, job_id: str, event: Mapping[str, Any]) -> None:
        """Appends an event to the job's waiter's inbox, or (nobody waits: a batch line) to
        the job's own event list, as the scripts' events go (`lua/lib.lua` emit_raw)."""
        inbox = self.redis.hget(self.keys.job(pool, job_id), "inbox")
        if inbox:
            if event.get("event") == "chunk":
                data = wire.dumps_bytes(event["data"])
                entry = chunk_entry(job_id, int(event.get("attempt") or 0), data)
            else:
                entry = event_entry(job_id, wire.dumps(dict(event)))
            pipe = self.redis.pipeline()
            pipe.rpush(inbox, entry)
            pipe.expire(inbox, self.config.keep_s)
            pipe.execute()
            return
        key, raw = self.keys.events(pool, job_id), wire.dumps(dict(event))
        if self._raw is None:
            pipe = self.redis.pipeline()
            pipe.rpush(key, raw)
            pipe.expire(key, self.config.keep_s)
            pipe.execute()
            return
        self._raw.pipeline(self.publish_commands([(key, raw)]))

    def publish_commands(self, events: list[tuple[str, str | bytes]]) -> list[tuple[Any, ...]]:
        """The commands that append `events` ((list key, entry) in order) to their lists (a
        job's event list, or a waiter's inbox), each list's in one RPUSH, in one
        transaction: a list is never left without its expiry."""
        by_key: dict[str, list[str | bytes]] = {}
        for key, raw in events:
            by_key.setdefault(key, []).append(raw)
        commands: list[tuple[Any, ...]] = [("MULTI",)]
        for key, raws in by_key.items():
            commands += [("RPUSH", key, *raws), ("EXPIRE", key, self.config.keep_s)]
        return [*commands, ("EXEC",)]

    def wait_event(self, pool: str, job_id: str, timeout_s: float) -> dict[str, Any] | None:
        """The job's next event, waiting up to `timeout_s`; None when none came."""
        answer = self.redis.blpop([self.keys.events(pool, job_id)], timeout=timeout_s)
        if answer is None:
            return None
        event: dict[str, Any] = wire.loads(_text(answer[1]))
        return event

    def events(self, pool: str, job_id: str) -> list[dict[str, Any]]:
        """The job's events nobody has taken yet, oldest first, left in place."""
        raws = self.redis.lrange(self.keys.events(pool, job_id), 0, -1)
        return [wire.loads(_text(raw)) for raw in raws]

    def forget_events(self, pool: str, job_id: str) -> None:
        """Drops the job's untaken events (a batch line's, once its answer is stored)."""
        self.redis.delete(self.keys.events(pool, job_id))

    # --- reads ------------------------------------------------------------------------------

    def _hash(self, key: str) -> dict[str, str]:
        return {_text(k): _text(v) for k, v in self.redis.hgetall(key).items()}

    def pool_engines(self, pool: str) -> list[str]:
        """The engines that take jobs of `pool` now, by name."""
        return sorted(_text(e) for e in self.redis.smembers(self.keys.pool_engines(pool)))

    def job_state(self, pool: str, job_id: str) -> tuple[str, int] | None:
        """A job's state and attempt, without its payload (which can be large)."""
        state, attempt = self.redis.hmget(self.keys.job(pool, job_id), ["state", "attempt"])
        return None if state is None else (_text(state), int(attempt or 0))

    def get_job(self, pool: str, job_id: str) -> Job | None:
        fields = self._hash(self.keys.job(pool, job_id))
        return Job.from_hash(job_id, fields) if fields else None

    def check(self, repair: bool = False) -> CheckReport:
        """Each pool's reserved totals and its tenants' leases' `held` against its in-flight
        jobs (`lua/check.lua`, a pool at a time: each pool's count is exact in itself).
        `repair` sets the totals to what the jobs hold. A tenant's figures are its pools'
        together."""
        tenants = sorted(_text(t) for t in self.redis.smembers(self.keys.tenants()))
        held: dict[str, tuple[int, int]] = dict.fromkeys(tenants, (0, 0))
        engines: dict[str, tuple[int, int, int, int]] = {}
        problems: list[str] = []
        for pool in self.pools():
            raw = self._check_pool(pool, repair, tenants)
            engines.update(
                {e: (int(v[0]), int(v[1]), int(v[2]), int(v[3])) for e, v in raw["engines"].items()}
            )
            for tenant, (recorded, expected) in raw["tenants"].items():
                was = held.get(tenant, (0, 0))
                held[tenant] = (was[0] + int(recorded), was[1] + int(expected))
            problems += raw["problems"]
        return CheckReport(
            tenant_reserved=held,
            engine_reserved=engines,
            problems=problems,
            repaired=repair and bool(problems),
        )

    def _check_pool(self, pool: str, repair: bool, tenants: list[str]) -> dict[str, Any]:
        flag = "1" if repair else "0"
        raw = json.loads(_text(self._run("check", pool, pool, flag, *tenants)))
        # cjson encodes an empty Lua table as an object, so an empty list may arrive as {}.
        return {
            name: raw[name] if isinstance(raw[name], kind) else kind()
            for name, kind in (("tenants", dict), ("engines", dict), ("problems", list))
        }

    def pools_with_waiting_work(self) -> list[str]:
        """The pools where some tenant has a job waiting (in two round trips, whatever the
        load): what housekeeping kicks every few seconds. `snapshot` reads the same through
        a round trip per running job and per tenant queue."""
        pools = self.pools()
        pipe = self.redis.pipeline(transaction=False)
        for pool in pools:
            for request_class in REQUEST_CLASSES:
                pipe.zcard(self.keys.backlog(pool, request_class))
        backlogged = iter(pipe.execute())
        return [pool for pool in pools if sum(next(backlogged) for _ in REQUEST_CLASSES) > 0]

    def engine_reserved_bytes(self) -> dict[str, int]:
        """The KV bytes reserved on each engine now (two round trips): the sampler's part of
        `snapshot`."""
        engines = self._pool_engines(None)
        pipe = self.redis.pipeline(transaction=False)
        for pool, engine in engines:
            pipe.hget(self.keys.engine_usage(pool, engine), "reserved")
        return {e: int(v or 0) for (_, e), v in zip(engines, pipe.execute(), strict=True)}

    def _pool_engines(self, pool: str | None) -> list[tuple[str, str]]:
        """(pool, engine) for each engine serving `pool`, or (None) any pool, in one round
        trip past the pools' names; by engine."""
        pools = self.pools() if pool is None else [pool]
        pipe = self.redis.pipeline(transaction=False)
        for name in pools:
            pipe.smembers(self.keys.pool_engines(name))
        found = zip(pools, pipe.execute(), strict=True)
        return sorted(
            ((p, _text(e)) for p, members in found for e in members), key=lambda pe: pe[1]
        )

    def _engine_states(
        self, pool: str | None, now: float | None, extra: Callable[[Any, str, str], None]
    ) -> tuple[float, Iterator[tuple[str, dict[str, str], dict[str, str], Iterator[Any]]]]:
        """Each engine (of `pool`, or all) with its policy and usage hashes, and the answers
        of what `extra` asked the pipeline for it, in two round trips; engines removed
        between the two reads are left out. With the moment of the read (Redis's clock)."""
        if now is None:
            seconds, micros = self.redis.time()
            now = seconds + micros / 1e6
        engines = self._pool_engines(pool)
        pipe = self.redis.pipeline(transaction=False)
        for engine_pool, engine in engines:
            pipe.hgetall(self.keys.engine(engine_pool, engine))
            pipe.hgetall(self.keys.engine_usage(engine_pool, engine))
            extra(pipe, engine_pool, engine)
        answers = iter(pipe.execute())

        def states() -> Iterator[tuple[str, dict[str, str], dict[str, str], Iterator[Any]]]:
            for _, engine in engines:
                fields = {_text(k): _text(v) for k, v in next(answers).items()}
                usage = {_text(k): _text(v) for k, v in next(answers).items()}
                yield engine, fields, usage, answers

        return now, states()

    def seat_reports(self, pool: str | None = None, now: float | None = None) -> list[EngineSeats]:
        """The seats of each engine (of `pool`, or all) by class: bounds, what the classes
        hold and their times to first token (`fairqueue.seats`), in two round trips."""

        def ttfts(pipe: Any, engine_pool: str, engine: str) -> None:
            for request_class in BOUNDED_CLASSES:
                pipe.lrange(self.keys.engine_ttfts(engine_pool, engine, request_class), 0, -1)

        now, states = self._engine_states(pool, now, ttfts)
        reports = []
        for engine, fields, usage, rest in states:
            samples = {c: [float(ms) for ms in next(rest)] for c in BOUNDED_CLASSES}
            if fields:  # removed between the two reads
                reports.append(engine_seats(engine, fields, usage, samples, now))
        return reports

    def reservation_reports(
        self, pool: str | None = None, now: float | None = None
    ) -> list[EngineReservation]:
        """The KV reservations of each engine (of `pool`, or all): mode, budget and its
        scale, reserved and measured (`fairqueue.reservations`), in two round trips."""
        now, states = self._engine_states(pool, now, lambda pipe, engine_pool, engine: None)
        return [
            engine_reservation(engine, fields, usage, now)
            for engine, fields, usage, _ in states
            if fields
        ]

    def output_predictions(self, pool: str) -> dict[str, int]:
        """Each tenant's predicted output per sequence in the pool (tokens), for those with
        enough answers seen (`lua/lib.lua` observe_output)."""
        raw = self.redis.hgetall(self.keys.output_predictions(pool))
        return {_text(k): int(_text(v)) for k, v in raw.items()}

    def snapshot(self, now: float | None = None) -> Snapshot:
        """Queues per pool, class and tenant, and reservations. Read without a lock: for
        people and dashboards, not for decisions."""
        if now is None:
            seconds, micros = self.redis.time()
            now = seconds + micros / 1e6
        rows: list[QueueRow] = []
        for pool in self.pools():
            running = self._running_counts(pool)
            for request_class in REQUEST_CLASSES:
                rows.extend(self._queue_rows(pool, request_class, running, now))
        tenants = sorted(_text(t) for t in self.redis.smembers(self.keys.tenants()))
        pool_engines = self._pool_engines(None)
        engines = [engine for _, engine in pool_engines]
        engine_use = [self._hash(self.keys.engine_usage(p, e)) for p, e in pool_engines]
        return Snapshot(
            queues=rows,
            tenant_reserved_bytes=self.tenant_held_bytes(tenants),
            engine_reserved_bytes={
                e: int(use.get("reserved", 0)) for e, use in zip(engines, engine_use, strict=True)
            },
            engine_inflight={
                e: int(use.get("inflight", 0)) for e, use in zip(engines, engine_use, strict=True)
            },
            engine_offline={
                e: int(use.get("offline", 0)) for e, use in zip(engines, engine_use, strict=True)
            },
        )

    def tenant_held_bytes(self, tenants: list[str]) -> dict[str, int]:
        """The bytes of their quota the tenants' running jobs hold, their pools' leases'
        `held` together (one round trip past the pools' names)."""
        pools = self.pools()
        pipe = self.redis.pipeline(transaction=False)
        for tenant in tenants:
            for pool in pools:
                pipe.hget(self.keys.lease(pool, tenant), "held")
        values = iter(pipe.execute())
        return {t: sum(int(next(values) or 0) for _ in pools) for t in tenants}

    def _running_counts(self, pool: str) -> dict[tuple[str, str, str], int]:
        counts: dict[tuple[str, str, str], int] = {}
        for job_id in self.redis.zrange(self.keys.inflight(pool), 0, -1):
            fields = self.redis.hmget(self.keys.job(pool, _text(job_id)), ["pool", "cls", "tenant"])
            if None not in fields:
                key = (_text(fields[0]), _text(fields[1]), _text(fields[2]))
                counts[key] = counts.get(key, 0) + 1
        return counts

    def _queue_rows(
        self,
        pool: str,
        request_class: str,
        running: Mapping[tuple[str, str, str], int],
        now: float,
    ) -> list[QueueRow]:
        counters = {
            t: float(c) for t, c in self._hash(self.keys.counters(pool, request_class)).items()
        }
        rows = []
        for tenant, counter in sorted(counters.items()):
            queue = self.keys.queue(pool, request_class, tenant)
            waiting = int(self.redis.llen(queue))
            head = self.redis.lindex(queue, 0)
            oldest = None
            if head is not None:
                enqueued = self.redis.hget(self.keys.job(pool, _text(head)), "enqueued_at")
                oldest = now - float(enqueued) if enqueued is not None else None
            rows.append(
                QueueRow(
                    pool=pool,
                    request_class=request_class,
                    tenant=tenant,
                    waiting=waiting,
                    running=running.get((pool, request_class, tenant), 0),
                    oldest_wait_s=oldest,
                    counter=counter,
                )
            )
        return rows
