"""Every Redis key the fair queue uses, named in one place.

The Lua scripts build the same names from the same prefix (see `lua/lib.lua`, whose key
functions mirror these one for one; `tests/fairqueue/test_lifecycle.py` checks that they
agree). Every key a pool's decisions touch carries the pool's Redis Cluster hash tag,
``{p:<pool>}``, so that a decision touches one hash slot: each function call declares the
tag's prefix (`Keys.pool_tag`) as its one key, which a cluster routes it by
(docs/decisions/0018-keys-under-the-pools-hash-tag.md). A tenant's quota spans the pools:
it is leased to them (`leases.py`), and a pool's decisions count what the tenant's jobs hold
there against its lease in the pool's slot, ``{p}lease:<tenant>``.

Layout (prefix defaults to ``gs:fq:``; ``{p}`` is the pool's tag, ``{p:<pool>}:``):

=====================================  =======  ===================================================
key                                    type     holds
=====================================  =======  ===================================================
``{p}job:{job_id}``                    hash     the job: tenant, pool, class, tokens, kv bytes,
                                                state, deadline, engine, attempt, lease, charge
``{p}job:{job_id}:events``             list     what happened to the job, JSON, for the waiter
                                                (BLPOP): requeued, expired, cancelled, and
                                                what the run says (chunks, done, error)
``{p}inbox:{waiter}``                  list     a waiting process's events of the pool's jobs
                                                it waits on ('<job id> <event>', `inbox.py`)
``{p}ledger``                          list     the usage ledger's rows the pool's releases
                                                left, for the flush (`tenants/usage_buffer.py`)
``{p}q:{class}:{tenant}``              list     the tenant's waiting job ids, head = left
``{p}backlog:{class}``                 zset     backlogged tenants scored by their VTC counter
``{p}vtc:{class}``                     hash     every tenant's VTC counter (also when idle)
``{p}vtcseated:{class}``               string   the highest stamp of a job of the class run to its
                                                end: no tenant joins the backlog below it
``{p}cvt``                             hash     class virtual time per class (stride scheduling)
``{p}tenant:{tenant}``                 hash     the pool's copy of the tenant's policy: weight,
                                                quota_bytes, burst_bytes
``tenant:{tenant}``                    hash     the tenant's policy the copies are made from
``tenants``                            set      tenants that have a policy
``{p}engine:{engine_id}``              hash     policy: pool, kv_budget_bytes, max_num_seqs,
                                                queued, offline_load_threshold,
                                                offline_gate_margin, offline_reserve, the seat
                                                bounds' target:{class}, fixed:{class},
                                                target_quantile, target_step, target_idle_s;
                                                the samplers' load, load_signal, load_closed;
                                                the controllers' below:, cut:, sampled:{class};
                                                the KV reservation, out_quantile, and the
                                                samplers' kv_excess_bytes, kv_used_at, kv_scale
``{p}engine:{engine_id}:use``          hash     reserved (bytes), inflight (seats), standard
                                                and offline (the seats those classes hold)
``{p}engine:{engine_id}:ttft:{class}`` list     the latest times to first token there (ms),
                                                newest first, of a class with a target
``engines``                            set      engines that have a policy
``{p}engines``                         set      engines serving the pool
``{p}shape``                           hash     what an enqueue checks a job against: engines (how
                                                many serve the pool), largest (KV budget),
                                                predicts (1: one reserves predictions)
``{p}affinity``                        hash     each affinity key's engine (its latest job's)
``{p}qkeys:{class}``                   hash     per tenant, the affinity key of every job in its
                                                queue of the class, or '*' where they differ
``{p}outpred``                         hash     each tenant's predicted output per sequence
                                                (tokens): the quantile of its latest answers
``{p}outlen:{tenant}``                 list     the tenant's latest output lengths per sequence
                                                in the pool (tokens), newest first
``pools``                              set      pools that ever had an engine
``{p}inflight``                        zset     running job ids scored by lease deadline
``{p}waiting``                         zset     queued job ids scored by queue deadline
``{p}loops:idle``                      zset     dispatch loops waiting for work, scored by when
                                                they stop waiting
``{p}loops:summoned``                  string   set while a summoned loop has not started (TTL)
``{p}loop:{token}:wake``               list     a waiting loop's wake-up
``{t:<tenant>}:quota``                 hash     the tenant's quota leases (leases.py): quota,
                                                burst, and per pool lease:{pool} (bytes leased
                                                there) and seq:{pool} (its latest grant's number)
``{p}lease:<tenant>``                  hash     the tenant's lease in the pool: leased, held
                                                (by its jobs there), seq (the latest grant
                                                applied or fenced), asked_at (when a pick
                                                last asked for more, until the lease changes)
``lease:starved``                      set      '<tenant> <pool>' where a pool asked for the
                                                tenant's quota and got too little: housekeeping
                                                brings the tenant's unused leases back
=====================================  =======  ===================================================

The indexes (``pools``, ``engines``, ``tenants``) and the policies the copies are made from are
written by plain commands, outside the scripts. Tenant, engine and job ids must not contain
``:``; a pool name may (it is never the last segment of a key, so names stay unambiguous),
but not ``{`` or ``}``, which would end its tag early. The leases' keys carry a tag too,
``{t:<tenant>}`` or ``{p:<pool>}``: each lease function touches one tag's keys, one slot.
"""

import re
from dataclasses import dataclass

DEFAULT_PREFIX = "gs:fq:"
_SEPARATOR_OR_SPACE = re.compile(r"[:\s]")
_BRACE = re.compile(r"[{}]")


def check_id(kind: str, value: str) -> str:
    """Refuse ids that would make key names ambiguous or empty."""
    if not value or _SEPARATOR_OR_SPACE.search(value):
        raise ValueError(f"{kind} id must be non-empty, without ':' or spaces: {value!r}")
    return value


def check_tag(kind: str, value: str) -> str:
    """Refuse a name that would end a `{hash tag}` early, or leave it empty."""
    if not value or _BRACE.search(value):
        raise ValueError(f"{kind} must be non-empty, without braces: {value!r}")
    return value


@dataclass(frozen=True)
class Keys:
    prefix: str = DEFAULT_PREFIX

    def pool_tag(self, pool: str) -> str:
        """What every key of the pool's slot starts with: the prefix and the pool's hash tag.
        Each function call declares it as its one key, which a cluster routes the call by."""
        return f"{self.prefix}{{p:{pool}}}:"

    def job(self, pool: str, job_id: str) -> str:
        return f"{self.pool_tag(pool)}job:{job_id}"

    def events(self, pool: str, job_id: str) -> str:
        return f"{self.pool_tag(pool)}job:{job_id}:events"

    def inbox(self, pool: str, waiter: str) -> str:
        """A waiting process's inbox in the pool: the events of all the jobs of the pool it
        waits on, each entry '<job id> <event>', read many at a time (see `lua/lib.lua`
        emit_raw)."""
        return f"{self.pool_tag(pool)}inbox:{waiter}"

    def ledger(self, pool: str) -> str:
        """The pool's outbox of the usage ledger's rows, which a release appends to."""
        return f"{self.pool_tag(pool)}ledger"

    def queue(self, pool: str, request_class: str, tenant: str) -> str:
        return f"{self.pool_tag(pool)}q:{request_class}:{tenant}"

    def backlog(self, pool: str, request_class: str) -> str:
        return f"{self.pool_tag(pool)}backlog:{request_class}"

    def counters(self, pool: str, request_class: str) -> str:
        return f"{self.pool_tag(pool)}vtc:{request_class}"

    def seated(self, pool: str, request_class: str) -> str:
        return f"{self.pool_tag(pool)}vtcseated:{request_class}"

    def class_clock(self, pool: str) -> str:
        return f"{self.pool_tag(pool)}cvt"

    def tenant_policy(self, tenant: str) -> str:
        """The tenant's policy as the platform last wrote it: what a pool's copy is made from."""
        return f"{self.prefix}tenant:{tenant}"

    def tenant(self, pool: str, tenant: str) -> str:
        """The pool's copy of the tenant's policy, which the pool's decisions read."""
        return f"{self.pool_tag(pool)}tenant:{tenant}"

    def tenants(self) -> str:
        return f"{self.prefix}tenants"

    def engine(self, pool: str, engine_id: str) -> str:
        return f"{self.pool_tag(pool)}engine:{engine_id}"

    def engine_usage(self, pool: str, engine_id: str) -> str:
        return f"{self.pool_tag(pool)}engine:{engine_id}:use"

    def engine_ttfts(self, pool: str, engine_id: str, request_class: str) -> str:
        return f"{self.pool_tag(pool)}engine:{engine_id}:ttft:{request_class}"

    def pool_shape(self, pool: str) -> str:
        return f"{self.pool_tag(pool)}shape"

    def pool_affinity(self, pool: str) -> str:
        return f"{self.pool_tag(pool)}affinity"

    def queue_keys(self, pool: str, request_class: str) -> str:
        return f"{self.pool_tag(pool)}qkeys:{request_class}"

    def output_predictions(self, pool: str) -> str:
        return f"{self.pool_tag(pool)}outpred"

    def output_lengths(self, pool: str, tenant: str) -> str:
        return f"{self.pool_tag(pool)}outlen:{tenant}"

    def engines(self) -> str:
        return f"{self.prefix}engines"

    def pool_engines(self, pool: str) -> str:
        return f"{self.pool_tag(pool)}engines"

    def pools(self) -> str:
        return f"{self.prefix}pools"

    def idle_loops(self, pool: str) -> str:
        return f"{self.pool_tag(pool)}loops:idle"

    def loop_summoned(self, pool: str) -> str:
        return f"{self.pool_tag(pool)}loops:summoned"

    def loop_wake(self, pool: str, token: str) -> str:
        return f"{self.pool_tag(pool)}loop:{token}:wake"

    def inflight(self, pool: str) -> str:
        return f"{self.pool_tag(pool)}inflight"

    def waiting(self, pool: str) -> str:
        return f"{self.pool_tag(pool)}waiting"

    def lease_quota(self, tenant: str) -> str:
        """The tenant's slot of the quota leases: its quota, burst and leases per pool."""
        return f"{self.prefix}{{t:{tenant}}}:quota"

    def lease_starved(self) -> str:
        """Where pools asked for a tenant's quota and got too little ('<tenant> <pool>')."""
        return f"{self.prefix}lease:starved"

    def lease(self, pool: str, tenant: str) -> str:
        """The tenant's lease in the pool's slot: leased, held, the latest grant's number."""
        return f"{self.pool_tag(pool)}lease:{tenant}"
