"""A pure-Python reference of the pick rule in `lua/pick.lua`, for one pool, without time.

The Lua scripts are what runs; this model states the same rule in plain Python so tests
can check its properties (hypothesis) without Redis and compare the scripts' decisions with
it step by step. Counters use the same float operations in the same order as the scripts,
so the two agree exactly, ties included (tenants tie-break by name, as a Redis sorted set
orders equal scores).
"""

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from fairqueue.domain import EnginePolicy, JobRejected, TenantPolicy
from protocol.classes import REQUEST_CLASSES, RequestClass


def token_charge(prompt_tokens: int, output_tokens: int, weight: float) -> float:
    """VTC service of a request: output tokens cost twice what prompt tokens do."""
    return (prompt_tokens + 2 * output_tokens) / weight


def lifted_counter(counter: float, backlogged: Iterable[float], seated: float) -> float:
    """The counter of a tenant that becomes backlogged: no less than the least backlogged
    counter, nor than `seated` (the highest stamp of a job of the class run to its end), so
    idle time is not banked (`lua/lib.lua` join_backlog)."""
    return max(counter, seated, min(backlogged, default=seated))


# --- seats by class (lua/lib.lua seats_below, class_limit, observe_ttft) ------------------

MISS_WEIGHT = 4.0


def held_below(held: Mapping[str, int], request_class: str) -> int:
    """The seats the classes below `request_class` hold, from the seats each class holds."""
    rank = REQUEST_CLASSES.index(request_class)
    return sum(held.get(name, 0) for name in REQUEST_CLASSES[rank + 1 :])


@dataclass
class SeatController:
    """One class's bound on one engine: the seats the classes below it may hold. `below` is
    None until its first measure (and after an idle spell): no bound."""

    target_s: float
    most: int  # the engine's seats and its queue
    seats: int  # the engine's seats
    quantile: float = 0.995
    step: float = 1.0
    idle_s: float = 30.0
    below: float | None = None
    cut_at: float = 0.0
    sampled_at: float = 0.0

    def observe(self, ttft_s: float, picked_at: float, now: float) -> None:
        below = self.below
        if below is None or now - self.sampled_at > self.idle_s:
            below = float(self.most)
        self.sampled_at = now
        if ttft_s > self.target_s:
            below = min(below, float(self.seats))  # above them it bounds queue places only
        if ttft_s <= self.target_s:
            below = below + self.step * (1 - self.quantile)
        elif picked_at > self.cut_at:
            below = below - self.step * self.quantile * min(ttft_s / self.target_s, MISS_WEIGHT)
            self.cut_at = now
        else:
            below = below - self.step * self.quantile
        self.below = min(float(self.most), max(1.0, below))

    def bound(self, now: float) -> int | None:
        """The seats the classes below may hold now; None: no bound (unmeasured, or idle)."""
        if self.below is None or now - self.sampled_at > self.idle_s:
            return None
        return max(1, math.floor(self.below))


def class_limit(
    bounds: Mapping[str, int | None], held: Mapping[str, int], request_class: str
) -> str:
    """'' while a job of `request_class` may take a seat, else the class above whose bound
    holds it back: a bound is full once the classes below hold as many seats as it allows."""
    for above in REQUEST_CLASSES[: REQUEST_CLASSES.index(request_class)]:
        bound = bounds.get(above)
        if bound is not None and held_below(held, above) >= bound:
            return above
    return ""


def class_order(clock: Mapping[str, float], open_classes: Iterable[str]) -> list[str]:
    """Classes to try, least class virtual time first; ties go to the higher class."""
    rank = {name: i for i, name in enumerate(REQUEST_CLASSES)}
    return sorted(open_classes, key=lambda name: (clock.get(name, 0.0), rank[name]))


def offline_gate(engine: EnginePolicy, *, inflight: int, offline: int, load_closed: bool) -> str:
    """'' while offline work may be picked for the engine, else what holds its gate shut:
    'online_seats', 'load' or 'seats' (`lua/lib.lua` offline_gate; docs/ARCHITECTURE.md)."""
    threshold = engine.offline_load_threshold
    if inflight - offline >= threshold * engine.max_num_seqs:
        return "online_seats"
    if engine.load >= threshold:
        return "load"
    if load_closed and engine.load >= threshold - engine.offline_gate_margin:
        return "load"
    if inflight >= engine.max_num_seqs - engine.offline_reserve:
        return "seats"
    return ""


# The most sequences the engine holding a job's prefix may run beyond the engine the job
# was chosen for, and still take it (`lua/lib.lua` AFFINITY_SLACK).
AFFINITY_SLACK = 2
# The most backlogged tenants past the fairest job a pick looks at for a job whose prefix
# the engine holds, when the fairest job's prefix is on another engine that cannot run it
# now (`lua/lib.lua` AFFINITY_SCAN; `FairModel._nearer`).
AFFINITY_SCAN = 8


def jain_index(values: Iterable[float]) -> float:
    """Jain's fairness index: 1.0 when all values are equal, 1/n when one has everything."""
    xs = list(values)
    square_of_sum = sum(xs) ** 2
    sum_of_squares = sum(x * x for x in xs)
    return square_of_sum / (len(xs) * sum_of_squares) if sum_of_squares else 1.0


@dataclass
class ModelJob:
    job_id: str
    tenant: str
    request_class: str
    prompt_tokens: int
    max_tokens: int
    kv_bytes: int
    state: str = "queued"
    engine_id: str = ""
    charged: float = 0.0
    weight: float = 1.0
    seqs: int = 1  # engine seats it takes
    stamp: float = 0.0  # its tenant's counter when picked: its place in the engine
    affinity: str = ""  # whose prefixes it shares; '' = none (`lua/lib.lua` affinity_engine)


class FairModel:
    """The scheduler's state and rule for one pool, in memory."""

    def __init__(
        self,
        class_weights: Mapping[str, float],
        tenants: Mapping[str, TenantPolicy],
        engines: Mapping[str, EnginePolicy],
    ) -> None:
        self.class_weights = dict(class_weights)
        self.tenants = dict(tenants)
        self.engines = dict(engines)
        self.jobs: dict[str, ModelJob] = {}
        self.queues: dict[tuple[str, str], deque[str]] = {}
        self.counters: dict[tuple[str, str], float] = {}
        self.seated: dict[str, float] = {}
        self.clock: dict[str, float] = {}
        self.tenant_reserved: dict[str, int] = dict.fromkeys(self.tenants, 0)
        self.engine_reserved: dict[str, int] = dict.fromkeys(self.engines, 0)
        self.engine_inflight: dict[str, int] = dict.fromkeys(self.engines, 0)
        self.engine_offline: dict[str, int] = dict.fromkeys(self.engines, 0)  # of inflight
        self.engine_standard: dict[str, int] = dict.fromkeys(self.engines, 0)  # of inflight
        self.load_closed: dict[str, bool] = dict.fromkeys(self.engines, False)
        # Affinity key -> the engine that ran its latest job.
        self.affinity: dict[str, str] = {}

    # --- queues and counters ----------------------------------------------------------------

    def _backlogged(self, request_class: str) -> list[str]:
        names = [t for (c, t), q in self.queues.items() if c == request_class and q]
        return sorted(names, key=lambda t: (self.counters[(request_class, t)], t))

    def _push(self, job: ModelJob, at_head: bool) -> None:
        key = (job.request_class, job.tenant)
        queue = self.queues.setdefault(key, deque())
        if not queue:
            others = [
                self.counters[(job.request_class, t)] for t in self._backlogged(job.request_class)
            ]
            self.counters[key] = lifted_counter(
                self.counters.get(key, 0.0), others, self.seated.get(job.request_class, 0.0)
            )
        if at_head:
            queue.appendleft(job.job_id)
        else:
            queue.append(job.job_id)

    def _remove(self, job: ModelJob) -> None:
        key = (job.request_class, job.tenant)
        self.queues[key].remove(job.job_id)

    def _recharge(self, job: ModelJob, new_charge: float) -> None:
        delta = new_charge - job.charged
        if delta != 0:
            key = (job.request_class, job.tenant)
            self.counters[key] = self.counters[key] + delta
        job.charged = new_charge

    def _free(self, job: ModelJob) -> None:
        self.tenant_reserved[job.tenant] -= job.kv_bytes
        self.engine_reserved[job.engine_id] -= job.kv_bytes
        self.engine_inflight[job.engine_id] -= job.seqs
        if job.request_class == RequestClass.OFFLINE:
            self.engine_offline[job.engine_id] -= job.seqs
        if job.request_class == RequestClass.STANDARD:
            self.engine_standard[job.engine_id] -= job.seqs

    # --- decisions ----------------------------------------------------------------------------

    def enqueue(self, job: ModelJob) -> None:
        policy = self.tenants.get(job.tenant)
        if policy is None:
            raise JobRejected("unknown_tenant", job.tenant)
        if job.kv_bytes > max(e.kv_budget_bytes for e in self.engines.values()):
            raise JobRejected("larger_than_engine", job.job_id)
        if job.kv_bytes > policy.quota_bytes + policy.burst_bytes:
            raise JobRejected("larger_than_quota", job.job_id)
        self.jobs[job.job_id] = job
        self._push(job, at_head=False)

    def _candidate(
        self, engine_id: str, request_class: str, free_bytes: int, allow_burst: bool
    ) -> tuple[ModelJob | None, bool]:
        would_burst = False
        tenants = self._backlogged(request_class)
        for index, tenant in enumerate(tenants):
            job = self.jobs[self.queues[(request_class, tenant)][0]]
            if job.kv_bytes > free_bytes:
                continue
            policy = self.tenants[tenant]
            held = self.tenant_reserved[tenant] + job.kv_bytes
            if held <= policy.quota_bytes:
                if allow_burst:
                    return job, False
                return self._nearer(engine_id, job, tenants[index + 1 :], free_bytes), False
            if held <= policy.quota_bytes + policy.burst_bytes:
                if allow_burst:
                    return job, False
                would_burst = True
        return None, would_burst

    def _nearer(
        self, engine_id: str, fairest: ModelJob, behind: list[str], free_bytes: int
    ) -> ModelJob:
        """The job a within-quota pick for `engine_id` runs in place of `fairest`, the fair
        order's: itself, unless another engine of the pool holds its prefix and cannot run
        it now (`affinity_engine`); then the head job of the first of the next AFFINITY_SCAN
        tenants of `behind` (the backlogged tenants after its own, in counter order) whose
        counter is at most its tenant's counter plus its charge, whose prefix `engine_id`
        holds and that runs there within quota (`lua/lib.lua` pick_on, candidate). A tenant
        so served runs at most about one request ahead of its fair place."""
        holder = self.affinity.get(fairest.affinity, "") if fairest.affinity else ""
        if not holder or holder == engine_id or holder not in self.engines:
            return fairest
        if self.affinity_engine(engine_id, fairest) != engine_id:
            return fairest
        request_class = fairest.request_class
        # Its charge as `pick` charges it: the scripts charge the output they expect, which in
        # the `worst` reservation mode (the model's) is its max_tokens.
        weight = self.tenants[fairest.tenant].weight
        charge = token_charge(fairest.prompt_tokens, fairest.max_tokens, weight)
        bound = self.counters[(request_class, fairest.tenant)] + charge
        for tenant in behind[:AFFINITY_SCAN]:
            if self.counters[(request_class, tenant)] > bound:
                break
            job = self.jobs[self.queues[(request_class, tenant)][0]]
            if not job.affinity or self.affinity.get(job.affinity) != engine_id:
                continue
            if job.kv_bytes > free_bytes:
                continue
            if self.tenant_reserved[tenant] + job.kv_bytes <= self.tenants[tenant].quota_bytes:
                return job
        return fairest

    def affinity_engine(self, chosen: str, job: ModelJob) -> str:
        """Where a job the fair order chose for engine `chosen` runs: on the engine that ran
        the latest job of its affinity key while that one can run it at once (a free seat,
        no more than AFFINITY_SLACK sequences beyond `chosen`'s, its class open, room for it
        in its KV, and its tenant's quota as the pick admitted it), else on `chosen`
        (`lua/lib.lua` affinity_engine)."""
        holder = self.affinity.get(job.affinity, "") if job.affinity else ""
        if not holder or holder == chosen or holder not in self.engines:
            return chosen
        engine = self.engines[holder]
        if self.engine_inflight[holder] >= engine.max_num_seqs:
            return chosen
        if self.engine_inflight[holder] > self.engine_inflight[chosen] + AFFINITY_SLACK:
            return chosen
        if job.request_class not in self.open_classes(holder):
            return chosen
        if job.kv_bytes > engine.kv_budget_bytes - self.engine_reserved[holder]:
            return chosen
        # The same quota admits it there as here: its cost is the same on both engines.
        return holder

    def set_load(self, engine_id: str, load: float) -> bool:
        """The samplers' load, with the gate's hysteresis (`lua/set_load.lua`)."""
        engine = self.engines[engine_id]
        threshold = engine.offline_load_threshold
        closed = load >= threshold or (
            self.load_closed[engine_id] and load >= threshold - engine.offline_gate_margin
        )
        self.engines[engine_id] = replace(engine, load=load)
        self.load_closed[engine_id] = closed
        return closed

    def offline_gate(self, engine_id: str) -> str:
        """'' while offline work may be picked for the engine, else what holds the gate
        shut: 'online_seats', 'load' or 'seats' (`lua/lib.lua` offline_gate)."""
        return offline_gate(
            self.engines[engine_id],
            inflight=self.engine_inflight[engine_id],
            offline=self.engine_offline[engine_id],
            load_closed=self.load_closed[engine_id],
        )

    def held(self, engine_id: str) -> dict[str, int]:
        """The seats each class holds on the engine."""
        standard, offline = self.engine_standard[engine_id], self.engine_offline[engine_id]
        held: dict[str, int] = {
            RequestClass.INTERACTIVE: self.engine_inflight[engine_id] - standard - offline,
            RequestClass.STANDARD: standard,
            RequestClass.OFFLINE: offline,
        }
        return held

    def open_classes(self, engine_id: str) -> list[str]:
        """The classes a pick for the engine may take: offline while its gate is open, and
        none whose seats a bound of a class above holds full (the model knows fixed bounds;
        tests/fairqueue/test_seat_controller.py checks the controllers')."""
        gate_open = self.offline_gate(engine_id) == ""
        held, bounds = self.held(engine_id), dict(self.engines[engine_id].fixed_seats_below)
        return [
            c
            for c in REQUEST_CLASSES
            if (c != RequestClass.OFFLINE or gate_open) and not class_limit(bounds, held, c)
        ]

    def choose(self, engine_id: str) -> ModelJob | None:
        engine = self.engines[engine_id]
        if self.engine_inflight[engine_id] >= engine.max_in_flight:
            return None
        free_bytes = engine.kv_budget_bytes - self.engine_reserved[engine_id]
        order = class_order(self.clock, self.open_classes(engine_id))
        burst_possible = False
        for request_class in order:
            job, would_burst = self._candidate(
                engine_id, request_class, free_bytes, allow_burst=False
            )
            if job is not None:
                return job
            burst_possible = burst_possible or would_burst
        if burst_possible:
            for request_class in order:
                job, _ = self._candidate(engine_id, request_class, free_bytes, allow_burst=True)
                if job is not None:
                    return job
        return None

    def pick(self, engine_id: str) -> ModelJob | None:
        """The fair order's next job for the engine (or, within quota, a job at most about
        one request behind it whose prefix the engine holds: `_nearer`), run on the engine
        that holds its prefix where it can (`affinity_engine`)."""
        job = self.choose(engine_id)
        if job is None:
            return None
        job.weight = self.tenants[job.tenant].weight
        job.stamp = self.counters[(job.request_class, job.tenant)]
        self._recharge(job, token_charge(job.prompt_tokens, job.max_tokens, job.weight))
        self._remove(job)
        chosen_time = self.clock.get(job.request_class, 0.0)
        for other in REQUEST_CLASSES:
            if other != job.request_class and self.clock.get(other, 0.0) < chosen_time:
                self.clock[other] = chosen_time
        self.clock[job.request_class] = chosen_time + 1 / self.class_weights[job.request_class]
        engine_id = self.affinity_engine(engine_id, job)
        if job.affinity:
            self.affinity[job.affinity] = engine_id
        job.state, job.engine_id = "running", engine_id
        self.tenant_reserved[job.tenant] += job.kv_bytes
        self.engine_reserved[engine_id] += job.kv_bytes
        self.engine_inflight[engine_id] += job.seqs
        if job.request_class == RequestClass.OFFLINE:
            self.engine_offline[engine_id] += job.seqs
        if job.request_class == RequestClass.STANDARD:
            self.engine_standard[engine_id] += job.seqs
        return job

    def engines_by_room(self) -> list[str]:
        """Most free KV first, ties by fewest in flight, then by name."""

        def room(engine_id: str) -> tuple[int, int, str]:
            free = self.engines[engine_id].kv_budget_bytes - self.engine_reserved[engine_id]
            return (-free, self.engine_inflight[engine_id], engine_id)

        return sorted(self.engines, key=room)

    def pick_in_pool(self) -> ModelJob | None:
        """A pick for the pool's engine with the most room that can run a job."""
        for engine_id in self.engines_by_room():
            job = self.pick(engine_id)
            if job is not None:
                return job
        return None

    def release(self, job_id: str, prompt_tokens: int, completion_tokens: int) -> bool:
        job = self.jobs.get(job_id)
        if job is None or job.state != "running":
            return False
        self._free(job)
        seated = self.seated.get(job.request_class, 0.0)
        self.seated[job.request_class] = max(seated, job.stamp)
        self._recharge(job, token_charge(prompt_tokens, completion_tokens, job.weight))
        job.state = "done"
        return True

    def cancel(self, job_id: str) -> str:
        job = self.jobs.get(job_id)
        if job is None or job.state not in ("queued", "running"):
            return ""
        previous = job.state
        if previous == "queued":
            self._remove(job)
        else:
            self._free(job)
            self._recharge(job, token_charge(job.prompt_tokens, 0, job.weight))
        job.state = "cancelled"
        return previous

    def requeue(self, job_id: str) -> bool:
        job = self.jobs.get(job_id)
        if job is None or job.state != "running":
            return False
        self._free(job)
        self._recharge(job, 0.0)
        job.state, job.engine_id = "queued", ""
        self._push(job, at_head=True)
        return True
