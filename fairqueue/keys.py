"""Every Redis key the fair queue uses, named in one place.

The Lua scripts build the same names from the same prefix (see `lua/lib.lua`, whose key
functions mirror these one for one; `tests/fairqueue/test_lifecycle.py` checks that they
agree). One Redis instance is assumed: scripts touch keys they derive at run time.

Layout (prefix defaults to ``gs:fq:``):

=====================================  =======  ===================================================
key                                    type     holds
=====================================  =======  ===================================================
``job:{job_id}``                       hash     the job: tenant, pool, class, tokens, kv bytes,
                                                state, deadline, engine, attempt, lease, charge
``job:{job_id}:events``                list     what happened to the job, JSON, for the waiter
                                                (BLPOP): requeued, expired, cancelled, and
                                                what the run says (chunks, done, error)
``q:{pool}:{class}:{tenant}``          list     the tenant's waiting job ids, head = left
``backlog:{pool}:{class}``             zset     backlogged tenants scored by their VTC counter
``vtc:{pool}:{class}``                 hash     every tenant's VTC counter (also when idle)
``vtcseated:{pool}:{class}``           string   the highest stamp of a job of the class run to its
                                                end: no tenant joins the backlog below it
``cvt:{pool}``                         hash     class virtual time per class (stride scheduling)
``tenant:{tenant}``                    hash     policy: weight, quota_bytes, burst_bytes
``tenant:{tenant}:use``                hash     reserved (bytes held by in-flight jobs)
``tenants``                            set      tenants that have a policy
``engine:{engine_id}``                 hash     policy: pool, kv_budget_bytes, max_num_seqs,
                                                queued, offline_load_threshold,
                                                offline_gate_margin, offline_reserve, the seat
                                                bounds' target:{class}, fixed:{class},
                                                target_quantile, target_step, target_idle_s;
                                                the samplers' load, load_signal, load_closed;
                                                the controllers' below:, cut:, sampled:{class};
                                                the KV reservation, out_quantile, and the
                                                samplers' kv_excess_bytes, kv_used_at, kv_scale
``engine:{engine_id}:use``             hash     reserved (bytes), inflight (seats), standard
                                                and offline (the seats those classes hold)
``engine:{engine_id}:ttft:{class}``    list     the latest times to first token there (ms),
                                                newest first, of a class with a target
``engines``                            set      engines that have a policy
``pool:{pool}:engines``                set      engines serving the pool
``pool:{pool}:shape``                 hash     what an enqueue checks a job against: engines (how
                                                many serve the pool), largest (KV budget),
                                                predicts (1: one reserves predictions)
``pool:{pool}:outpred``                hash     each tenant's predicted output per sequence
                                                (tokens): the quantile of its latest answers
``outlen:{pool}:{tenant}``             list     the tenant's latest output lengths per sequence
                                                in the pool (tokens), newest first
``pools``                              set      pools that ever had a job or an engine
``inflight``                           zset     running job ids scored by lease deadline
``waiting``                            zset     queued job ids scored by queue deadline
``loops:{pool}:idle``                  zset     dispatch loops waiting for work, scored by when
                                                they stop waiting
``loops:{pool}:summoned``              string   set while a summoned loop has not started (TTL)
``loop:{token}:wake``                  list     a waiting loop's wake-up
``{t:<tenant>}:quota``                 hash     the tenant's quota leases (leases.py): quota,
                                                burst, and per pool lease:{pool} (bytes leased
                                                there) and seq:{pool} (its latest grant's number)
``{p:<pool>}:lease:<tenant>``          hash     the tenant's lease in the pool: leased, held
                                                (by its jobs there), seq (the latest grant
                                                applied or fenced)
=====================================  =======  ===================================================

Tenant, engine and job ids must not contain ``:``; a pool name may (it is never the last
segment of a key, so names stay unambiguous). The leases' keys carry a Redis Cluster hash tag,
``{t:<tenant>}`` or ``{p:<pool>}``: each lease function touches one tag's keys, one slot. A
pool name in a tag must not contain ``{`` or ``}``, which would end the tag early.
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

    def job(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}"

    def events(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}:events"

    def inbox(self, waiter: str) -> str:
        """A waiting process's inbox: the events of all the jobs it waits on, each entry
        '<job id> <event>', read many at a time (see `lua/lib.lua` emit_raw)."""
        return f"{self.prefix}inbox:{waiter}"

    def queue(self, pool: str, request_class: str, tenant: str) -> str:
        return f"{self.prefix}q:{pool}:{request_class}:{tenant}"

    def backlog(self, pool: str, request_class: str) -> str:
        return f"{self.prefix}backlog:{pool}:{request_class}"

    def counters(self, pool: str, request_class: str) -> str:
        return f"{self.prefix}vtc:{pool}:{request_class}"

    def seated(self, pool: str, request_class: str) -> str:
        return f"{self.prefix}vtcseated:{pool}:{request_class}"

    def class_clock(self, pool: str) -> str:
        return f"{self.prefix}cvt:{pool}"

    def tenant(self, tenant: str) -> str:
        return f"{self.prefix}tenant:{tenant}"

    def tenant_usage(self, tenant: str) -> str:
        return f"{self.prefix}tenant:{tenant}:use"

    def tenants(self) -> str:
        return f"{self.prefix}tenants"

    def engine(self, engine_id: str) -> str:
        return f"{self.prefix}engine:{engine_id}"

    def engine_usage(self, engine_id: str) -> str:
        return f"{self.prefix}engine:{engine_id}:use"

    def engine_ttfts(self, engine_id: str, request_class: str) -> str:
        return f"{self.prefix}engine:{engine_id}:ttft:{request_class}"

    def pool_shape(self, pool: str) -> str:
        return f"{self.prefix}pool:{pool}:shape"

    def pool_affinity(self, pool: str) -> str:
        return f"{self.prefix}pool:{pool}:affinity"

    def output_predictions(self, pool: str) -> str:
        return f"{self.prefix}pool:{pool}:outpred"

    def output_lengths(self, pool: str, tenant: str) -> str:
        return f"{self.prefix}outlen:{pool}:{tenant}"

    def engines(self) -> str:
        return f"{self.prefix}engines"

    def pool_engines(self, pool: str) -> str:
        return f"{self.prefix}pool:{pool}:engines"

    def pools(self) -> str:
        return f"{self.prefix}pools"

    def idle_loops(self, pool: str) -> str:
        return f"{self.prefix}loops:{pool}:idle"

    def loop_summoned(self, pool: str) -> str:
        return f"{self.prefix}loops:{pool}:summoned"

    def loop_wake(self, token: str) -> str:
        return f"{self.prefix}loop:{token}:wake"

    def inflight(self) -> str:
        return f"{self.prefix}inflight"

    def waiting(self) -> str:
        return f"{self.prefix}waiting"

    def lease_quota(self, tenant: str) -> str:
        """The tenant's slot of the quota leases: its quota, burst and leases per pool."""
        return f"{self.prefix}{{t:{tenant}}}:quota"

    def lease(self, pool: str, tenant: str) -> str:
        """The tenant's lease in the pool's slot: leased, held, the latest grant's number."""
        return f"{self.prefix}{{p:{pool}}}:lease:{tenant}"
