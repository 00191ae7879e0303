"""The cores a CPU engine's model runs on, where several CPU engines share a node.

vLLM's CPU engine binds its model worker's OpenMP threads to cores
(VLLM_CPU_OMP_THREADS_BIND, `auto` by default): the node's CPUs less one it reserves. Every
engine on a node makes the same choice, so two CPU engines bind to the same cores, and with
their EngineCores pinned there too (`cpu_affinity`), two busy-waiting schedulers and two
models share those cores. The kernel then runs one engine for tens of seconds while the
other's model, runnable, waits: requests the fair queue placed there stand still, and the
tenants they belong to lose their share (docs/performance.md, "Two CPU engines on one core").

So the supervisor gives each CPU engine of a node cores of its own, as it gives each GPU
engine a card of its own: the node's CPUs are divided among the engines registered on its
CPU device, in the order of their ids. A node with one CPU engine keeps vLLM's own binding,
which also knows the node's SMT siblings and NUMA nodes. An operator who binds engines
themselves sets VLLM_CPU_OMP_THREADS_BIND in the agent's environment, and it is left as set.
"""

from __future__ import annotations

from collections.abc import Sequence

OMP_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def engine_cores(cpus: Sequence[int], *, engines: int, position: int) -> tuple[int, ...]:
    """The CPUs of `cpus` the `position`-th (from 0) of `engines` CPU engines binds to: an
    equal share of them, less one CPU kept for the platform where that leaves each engine
    at least one; the shares do not overlap while there are at least as many CPUs as engines,
    and wrap around the CPUs when there are more engines than CPUs. Empty (vLLM's own
    binding) for a lone engine."""
    if engines < 1 or not 0 <= position < engines:
        raise ValueError(f"engine {position} of {engines}")
    ordered = sorted(set(cpus))
    if engines == 1 or not ordered:
        return ()
    share = max(1, (len(ordered) - 1) // engines)
    start = position * share
    return tuple(sorted({ordered[(start + i) % len(ordered)] for i in range(share)}))


def omp_threads_bind(cores: Sequence[int]) -> str:
    """VLLM_CPU_OMP_THREADS_BIND's form of a CPU list: ranges joined by commas, `0-3,8`."""
    if not cores:
        raise ValueError("no cores to bind to")
    ordered = sorted(set(cores))
    ranges: list[str] = []
    first = last = ordered[0]
    for cpu in ordered[1:]:
        if cpu == last + 1:
            last = cpu
            continue
        ranges.append(f"{first}-{last}" if last > first else str(first))
        first = last = cpu
    ranges.append(f"{first}-{last}" if last > first else str(first))
    return ",".join(ranges)
