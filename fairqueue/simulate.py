"""A deterministic simulation that drives the real Redis scheduler with a simulated engine.

The engine has `seats` sequences (its max_num_seqs) and produces one output token per
running sequence per tick, so it drains tokens at a fixed rate. Each tick: tenants submit
(a backlogged tenant is topped up so its queue never runs dry; a paced tenant submits one
job every `every` ticks), running jobs advance and those that produced all their output are
released with their real counts, then free seats are filled by `pick`. Output lengths come
from a seeded random generator, so a run is repeatable. Service is counted as VTC counts
it: prompt + 2 x output tokens.
"""

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from fairqueue.domain import EnginePolicy, TenantPolicy
from fairqueue.model import jain_index
from fairqueue.queue import FairQueue

SIM_POOL = "sim"
SIM_ENGINE = "sim-engine"
BIG = 1 << 50  # bytes: memory is not what these runs are about


@dataclass(frozen=True)
class SimTenant:
    name: str
    weight: float = 1.0
    every: int = 0  # submit one job every `every` ticks; 0 = always backlogged
    start: int = 0  # first tick it submits at
    request_class: str = "standard"


@dataclass
class SimResult:
    ticks: int
    service: dict[str, int] = field(default_factory=dict)
    waits: dict[str, list[float]] = field(default_factory=dict)
    picks: list[tuple[int, str]] = field(default_factory=list)  # (tick, tenant)

    def shares(self) -> dict[str, float]:
        total = sum(self.service.values()) or 1
        return {name: served / total for name, served in self.service.items()}

    def jain(self, weights: dict[str, float]) -> float:
        return jain_index(self.service[name] / weight for name, weight in weights.items())


@dataclass
class _Running:
    tenant: str
    prompt_tokens: int
    output_tokens: int
    produced: int = 0


def simulate(
    fq: FairQueue,
    tenants: Sequence[SimTenant],
    *,
    ticks: int,
    seats: int = 8,
    prompt_tokens: int = 16,
    max_tokens: int = 40,
    seed: int = 7,
) -> SimResult:
    """Runs the simulation on `fq` (its pool SIM_POOL must be empty) and returns service,
    waits (in ticks) and the order of picks."""
    rng = random.Random(seed)
    for tenant in tenants:
        fq.set_tenant_policy(tenant.name, TenantPolicy(tenant.weight, BIG))
    fq.set_engine_policy(EnginePolicy(SIM_ENGINE, SIM_POOL, BIG, seats, 1.0, 0.0))
    result = SimResult(ticks, {t.name: 0 for t in tenants}, {t.name: [] for t in tenants})
    queued = {t.name: 0 for t in tenants}
    outputs: dict[str, int] = {}
    running: dict[str, _Running] = {}

    def submit(tenant: SimTenant, tick: int) -> None:
        job = fq.enqueue(
            tenant=tenant.name,
            pool=SIM_POOL,
            request_class=tenant.request_class,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            kv_bytes=1,
            now=float(tick),
        )
        outputs[job.job_id] = rng.randint(max_tokens // 5, max_tokens)
        queued[tenant.name] += 1

    for tick in range(ticks):
        for tenant in tenants:
            if tick < tenant.start:
                continue
            if tenant.every == 0:
                while queued[tenant.name] < seats + 2:
                    submit(tenant, tick)
            elif (tick - tenant.start) % tenant.every == 0:
                submit(tenant, tick)
        for job_id, run in list(running.items()):
            run.produced += 1
            if run.produced >= run.output_tokens:
                fq.release(SIM_POOL, job_id, run.prompt_tokens, run.output_tokens, now=float(tick))
                result.service[run.tenant] += run.prompt_tokens + 2 * run.output_tokens
                del running[job_id]
        while (job := fq.pick(SIM_POOL, SIM_ENGINE, now=float(tick))) is not None:
            queued[job.tenant] -= 1
            result.waits[job.tenant].append(tick - job.enqueued_at)
            result.picks.append((tick, job.tenant))
            running[job.job_id] = _Running(job.tenant, job.prompt_tokens, outputs.pop(job.job_id))
    return result
