"""The fair queue's records: jobs, policies, configuration, reports. Plain Python."""

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from protocol.classes import REQUEST_CLASSES, RequestClass

DEFAULT_CLASS_WEIGHTS: dict[str, float] = {
    RequestClass.INTERACTIVE: 8.0,
    RequestClass.STANDARD: 3.0,
    RequestClass.OFFLINE: 1.0,
}
DEFAULT_QUEUE_TIMEOUTS_S: dict[str, float] = {
    RequestClass.INTERACTIVE: 30.0,
    RequestClass.STANDARD: 300.0,
    RequestClass.OFFLINE: 24 * 3600.0,
}


class JobState:
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


@dataclass(frozen=True)
class TenantPolicy:
    """What the scheduler needs of a tenant; amounts are bytes (1 unit = 256 MiB)."""

    weight: float
    quota_bytes: int
    burst_bytes: int = 0

    def __post_init__(self) -> None:
        if self.weight <= 0:
            raise ValueError("a tenant's weight must be positive")
        if self.quota_bytes < 0 or self.burst_bytes < 0:
            raise ValueError("quota and burst cannot be negative")


# The classes a seat bound protects: each has classes below it.
BOUNDED_CLASSES: tuple[str, ...] = (RequestClass.INTERACTIVE, RequestClass.STANDARD)


@dataclass(frozen=True)
class ControllerSettings:
    """How the seat controllers move (lua/lib.lua `observe_ttft`): the share `quantile` of
    a class's times to first token is to be within its target; a bound moves by `step` seats
    per (weighted) miss; a class unmeasured for `idle_s` seconds bounds nothing."""

    quantile: float = 0.995
    step: float = 1.0
    idle_s: float = 30.0

    def __post_init__(self) -> None:
        if not 0.5 <= self.quantile < 1:
            raise ValueError("the target quantile is in [0.5, 1)")
        if self.step <= 0 or self.idle_s <= 0:
            raise ValueError("the controller's step and idle time must be positive")


# How jobs reserve KV on an engine (EnginePolicy.reservation).
RESERVATION_MODES = ("predict", "worst")


@dataclass(frozen=True)
class EnginePolicy:
    """One engine as admission sees it. `load` is 0..1 (docs/ARCHITECTURE.md, The offline gate).

    An engine runs `max_num_seqs` requests at once (its seats) and holds up to
    `queued` more in its own waiting queue, each with its KV reserved like a running one: a
    seat that frees is refilled inside the engine at its next step, while the next pick
    is still on its way (docs/decisions/0002-a-queue-inside-each-engine.md)."""

    engine_id: str
    pool: str
    kv_budget_bytes: int
    max_num_seqs: int
    offline_load_threshold: float = 0.4
    load: float = 0.0
    queued: int = 0
    # The offline gate (lua/lib.lua `offline_gate`): once the load closed it, it reopens
    # below offline_load_threshold - offline_gate_margin; offline work leaves
    # `offline_reserve` of the seats free for online work arriving.
    offline_gate_margin: float = 0.0
    offline_reserve: int = 0
    # The seat bounds (lua/lib.lua `seats_below`), by the class they protect: a time to first
    # token target (seconds) that a controller holds by bounding the seats of the classes
    # below, or a fixed number of seats for those classes. A class with neither bounds none.
    ttft_targets_s: Mapping[str, float] = field(default_factory=dict)
    fixed_seats_below: Mapping[str, int] = field(default_factory=dict)
    seat_controller: ControllerSettings = field(default_factory=ControllerSettings)
    # What a job reserves there (lua/lib.lua `job_cost`): `worst`, its prompts and every token
    # it may generate; `predict`, its prompts and the output its tenant's answers reach at
    # `output_quantile`, growing while it generates past that.
    reservation: str = "worst"
    output_quantile: float = 0.95

    def __post_init__(self) -> None:
        if self.reservation not in RESERVATION_MODES:
            raise ValueError(f"a reservation mode is one of {', '.join(RESERVATION_MODES)}")
        if not 0.5 <= self.output_quantile <= 1:
            raise ValueError("the output quantile is in [0.5, 1]")
        if min(self.kv_budget_bytes, self.max_num_seqs, self.queued, self.offline_reserve) < 0:
            raise ValueError(
                "an engine's KV budget, max_num_seqs, queue and offline reserve cannot be negative"
            )
        for name in [*self.ttft_targets_s, *self.fixed_seats_below]:
            if name not in BOUNDED_CLASSES:
                raise ValueError(f"only {' and '.join(BOUNDED_CLASSES)} bound lower classes")
        if min(self.ttft_targets_s.values(), default=1.0) <= 0:
            raise ValueError("a time to first token target must be positive")
        if min(self.fixed_seats_below.values(), default=1) < 1:
            raise ValueError("a fixed bound leaves the classes below at least one seat")

    @property
    def max_in_flight(self) -> int:
        return self.max_num_seqs + self.queued


@dataclass(frozen=True)
class FairQueueConfig:
    class_weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_CLASS_WEIGHTS))
    queue_timeouts_s: Mapping[str, float] = field(
        default_factory=lambda: dict(DEFAULT_QUEUE_TIMEOUTS_S)
    )
    # Short leases renewed by the worker while it streams: a dead worker's job comes back soon.
    lease_s: float = 120.0
    # How long a finished job's record and its event list stay readable (idempotent release,
    # a late waiter, the result of a duplicate run).
    keep_s: int = 600
    prefix: str = "gs:fq:"
    # A dispatch loop waiting for work is registered as idle for this long, renewed while it
    # waits (`FairQueue.wait_for_work`): a loop that died waiting stops being woken soon.
    loop_idle_s: float = 5.0
    # A summoned loop that has not started within this long no longer stops the next summons.
    loop_summon_s: int = 5
    # The replicas that acknowledge a state-changing script's writes (WAIT) before its answer
    # is acted on, and how long WAIT waits for them; 0: none (`queue.FENCED_SCRIPTS`).
    replicas_ack: int = 0
    replicas_ack_timeout_ms: int = 1000
    # How long a release that was not acknowledged is tried again (`aio.AsyncFairQueue`).
    settle_retry_s: float = 60.0

    def __post_init__(self) -> None:
        for name in REQUEST_CLASSES:
            if self.class_weights.get(name, 0) <= 0:
                raise ValueError(f"class weight of {name} must be positive")
            if self.queue_timeouts_s.get(name, 0) <= 0:
                raise ValueError(f"queue timeout of {name} must be positive")

    def weight_args(self) -> list[float]:
        return [float(self.class_weights[name]) for name in REQUEST_CLASSES]

    def timeout_args(self) -> list[float]:
        return [float(self.queue_timeouts_s[name]) for name in REQUEST_CLASSES]


@dataclass
class DispatchLoop:
    """A worker's picker of a pool (workers/dispatch.py) as the queue knows it: its token (its
    wake-up list), whether its first pick is still to come, and whether that pick asked it to
    summon the next picker (more work waited and no picker was idle)."""

    token: str
    starting: bool = True
    summon_next: bool = False


def config_from_settings(settings: Any) -> FairQueueConfig:
    """Builds the config from Django settings (duck-typed: this package imports no Django)."""
    weights = list(getattr(settings, "GPUSHARE_SCHED_CLASS_WEIGHTS", []))
    timeouts = getattr(settings, "GPUSHARE_SCHED_QUEUE_TIMEOUTS_S", DEFAULT_QUEUE_TIMEOUTS_S)
    return FairQueueConfig(
        class_weights=dict(zip(REQUEST_CLASSES, map(float, weights), strict=True))
        if weights
        else dict(DEFAULT_CLASS_WEIGHTS),
        queue_timeouts_s=dict(timeouts),
        lease_s=float(getattr(settings, "GPUSHARE_SCHED_LEASE_S", 120.0)),
        keep_s=int(getattr(settings, "GPUSHARE_SCHED_KEEP_S", 600)),
        prefix=str(getattr(settings, "GPUSHARE_SCHED_KEY_PREFIX", "gs:fq:")),
        replicas_ack=int(getattr(settings, "GPUSHARE_REDIS_REPLICAS_ACK", 0)),
        replicas_ack_timeout_ms=int(
            getattr(settings, "GPUSHARE_REDIS_REPLICAS_ACK_TIMEOUT_MS", 1000)
        ),
    )


class JobRejected(Exception):
    """The job can never run as asked; `reason` is a stable code for the API to map."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Job:
    job_id: str
    tenant: str
    pool: str
    request_class: str
    prompt_tokens: int
    max_tokens: int
    kv_bytes: int
    payload: str = ""
    state: str = JobState.QUEUED
    enqueued_at: float = 0.0
    deadline: float = 0.0
    engine_id: str = ""
    attempt: int = 0
    lease_deadline: float | None = None
    charged: float = 0.0
    reason: str = ""
    # The report of a web that streamed the job's answer from its engine itself (a granted
    # stream, see scheduler/online/granted.py), kept for a run that picks it after its first
    # run's worker died: the answer was given; only its release is left.
    answered: str = ""
    # The sequences it runs (n samples of each of its prompts): the engine seats it takes.
    seqs: int = 1
    # Its tenant's VTC counter when it was picked: its place in the engine (engine_priority).
    stamp: float = 0.0
    # KV it reserves on its engine while it runs, and what a prediction of it is made of
    # (FairQueue.enqueue_args): the bytes of its prompts, the bytes per token generated.
    reserved: int = 0
    kv_floor: int = 0
    kv_token: int = 0
    # Whose prefixes it shares (its tenant's or its cache group's): a pick runs it on the
    # engine of its pool that ran the latest job of the same key where it can (`lua/lib.lua`
    # affinity_engine); '' = wherever the pick chooses.
    affinity: str = ""

    @property
    def covered_tokens(self) -> int:
        """The tokens (its sequences' together) its reservation covers, past which it must
        grow (`FairQueue.grow`); -1: it reserves its worst case and never grows."""
        if self.kv_token <= 0 or self.reserved >= self.kv_bytes:
            return -1
        return (self.reserved - self.kv_floor) // self.kv_token

    @classmethod
    def from_hash(cls, job_id: str, fields: Mapping[str, str]) -> "Job":
        lease = fields.get("lease_deadline", "")
        return cls(
            job_id=job_id,
            tenant=fields["tenant"],
            pool=fields["pool"],
            request_class=fields["cls"],
            prompt_tokens=int(fields["prompt_tokens"]),
            max_tokens=int(fields["max_tokens"]),
            kv_bytes=int(fields["kv_bytes"]),
            payload=fields.get("payload", ""),
            state=fields["state"],
            enqueued_at=float(fields.get("enqueued_at", 0)),
            deadline=float(fields.get("deadline", 0)),
            engine_id=fields.get("engine", ""),
            attempt=int(fields.get("attempt", 0)),
            lease_deadline=float(lease) if lease else None,
            charged=float(fields.get("charged", 0)),
            reason=fields.get("reason", ""),
            answered=fields.get("answered", ""),
            seqs=int(fields.get("seqs") or 1),
            stamp=float(fields.get("stamp") or 0.0),
            reserved=int(fields.get("reserved") or 0),
            kv_floor=int(fields.get("kv_floor") or 0),
            kv_token=int(fields.get("kv_token") or 0),
            affinity=fields.get("affinity", ""),
        )


@dataclass(frozen=True)
class LeaseWant:
    """A pick's answer where the tenant's quota lease in the pool alone holds its fairest
    job back (lua/lib.lua pick_on): ask the tenant's slot for `want` bytes (quota + burst
    where `idle`: the pool has idle capacity), of which `need` admit the job, then pick again
    for `engine` ('' = any)."""

    tenant: str
    pool: str
    idle: bool
    want: int
    need: int
    engine: str = ""

    @classmethod
    def from_fields(cls, pool: str, fields: Mapping[str, Any]) -> "LeaseWant":
        return cls(
            tenant=str(fields["tenant"]),
            pool=pool,
            idle=bool(int(fields.get("idle") or 0)),
            want=int(fields["want"]),
            need=int(fields["need"]),
            engine=str(fields.get("engine") or ""),
        )


@dataclass(frozen=True)
class CheckReport:
    """Reserved totals against what the in-flight jobs hold; `problems` empty = no drift."""

    tenant_reserved: dict[str, tuple[int, int]]  # tenant -> (recorded, expected) bytes
    engine_reserved: dict[str, tuple[int, int, int, int]]  # bytes and jobs, recorded/expected
    problems: list[str]
    repaired: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class QueueRow:
    """One line of the status: a tenant's jobs in one pool and class."""

    pool: str
    request_class: str
    tenant: str
    waiting: int
    running: int
    oldest_wait_s: float | None
    counter: float


@dataclass(frozen=True)
class Snapshot:
    queues: list[QueueRow]
    tenant_reserved_bytes: dict[str, int]
    engine_reserved_bytes: dict[str, int]
    engine_inflight: dict[str, int]
    # Of engine_inflight, the seats offline jobs hold.
    engine_offline: dict[str, int] = field(default_factory=dict)


def payload_summary(payload: Mapping[str, Any]) -> str:
    """What a job keeps of its payload once it is over (JSON): everything but the request's
    `body`, which can be megabytes and is no one's business after the run; the ledger's fields
    (tenant, key, model, endpoint, batch, when it came) stay for the rows written later."""
    return json.dumps({name: value for name, value in payload.items() if name != "body"})
