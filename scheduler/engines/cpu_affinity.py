"""A CPU engine's scheduler process runs on the CPUs of its model process.

vLLM's CPU engine is three processes: the API server, `VLLM::EngineCore` (the scheduler)
and `VLLM::Worker` (the model). vLLM binds the Worker's OpenMP threads to cores
(VLLM_CPU_OMP_THREADS_BIND), but not the EngineCore, and the EngineCore busy-waits on the
Worker: its shared-memory queue spins with sched_yield for a second after each message. Left
free, it takes most of another core from the API server and the platform's web, worker and
Redis, and the engine's throughput swings with whatever else runs. Pinned to the Worker's
CPUs, its spinning yields to the Worker instead of taking a core of its own, and the engine's
throughput is steady.

So once a CPU engine answers, every thread of its EngineCore (/proc/<pid>/task/*) gets the
CPU set of its Worker (the union of the Worker's threads' affinities). Nothing is changed
when that set already covers every CPU the EngineCore may use. Pinning is an optimisation,
never a condition of starting: a process not found, a thread that exited or an affinity
refused is a warning, and the engine runs as it is.

The /proc root and the affinity calls are parameters, so the choice of processes is tested
on a fake /proc tree.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PROC = Path("/proc")
# /proc/<pid>/comm holds at most 15 characters: "VLLM::EngineCore" reads "VLLM::EngineCor".
ENGINE_CORE_COMM = "VLLM::EngineCor"
WORKER_COMM = "VLLM::Worker"  # also "VLLM::Worker_TP0" and the like
MAX_THREAD_SCANS = 3

GetAffinity = Callable[[int], set[int]]
SetAffinity = Callable[[int, Iterable[int]], None]


@dataclass(frozen=True)
class EngineProcesses:
    engine_cores: tuple[int, ...]
    workers: tuple[int, ...]


def _parent_pid(stat: str) -> int:
    # "pid (comm) state ppid ...": the comm may contain spaces and parentheses.
    return int(stat.rsplit(")", 1)[1].split()[1])


def _children(proc_root: Path) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = _parent_pid((entry / "stat").read_text())
        except (OSError, IndexError, ValueError):
            continue  # it exited while being read, or is not readable
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def descendants(pid: int, *, proc_root: Path = PROC) -> list[int]:
    """The pids of the process's children, their children, and so on."""
    children = _children(proc_root)
    found: list[int] = []
    todo = list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        if child not in found:
            found.append(child)
            todo.extend(children.get(child, ()))
    return sorted(found)


def _comm(pid: int, proc_root: Path) -> str:
    try:
        return (proc_root / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


def find_engine_processes(api_pid: int, *, proc_root: Path = PROC) -> EngineProcesses:
    """The EngineCore and Worker processes below a vLLM API server, by their names."""
    cores: list[int] = []
    workers: list[int] = []
    for pid in descendants(api_pid, proc_root=proc_root):
        comm = _comm(pid, proc_root)
        if comm.startswith(ENGINE_CORE_COMM):
            cores.append(pid)
        elif comm.startswith(WORKER_COMM):
            workers.append(pid)
    return EngineProcesses(engine_cores=tuple(cores), workers=tuple(workers))


def thread_ids(pid: int, *, proc_root: Path = PROC) -> list[int]:
    """The process's threads; just the pid when /proc/<pid>/task cannot be read."""
    try:
        tids = [int(entry.name) for entry in (proc_root / str(pid) / "task").iterdir()]
    except (OSError, ValueError):
        return [pid]
    return sorted(tids) or [pid]


def process_cpus(
    pid: int, *, proc_root: Path = PROC, get_affinity: GetAffinity = os.sched_getaffinity
) -> set[int]:
    """The CPUs any thread of the process may run on. Threads that exit meanwhile are
    skipped; OSError if none could be read."""
    cpus: set[int] = set()
    read_any = False
    for tid in thread_ids(pid, proc_root=proc_root):
        try:
            cpus |= get_affinity(tid)
        except OSError:
            continue
        read_any = True
    if not read_any:
        raise ProcessLookupError(f"no thread of process {pid} could be read")
    return cpus


def pin_threads(
    pid: int,
    cpus: set[int],
    *,
    proc_root: Path = PROC,
    set_affinity: SetAffinity = os.sched_setaffinity,
) -> tuple[int, list[str]]:
    """Every thread of the process to `cpus`. Returns how many threads were pinned, and why
    the others were not (a thread that exited meanwhile is no failure and not counted).

    A thread started while the others are pinned takes the affinity of the thread that
    started it, which may not be pinned yet, so the threads are listed again until no new
    one appears."""
    pinned = 0
    failures: list[str] = []
    seen: set[int] = set()
    for _ in range(MAX_THREAD_SCANS):
        new = [tid for tid in thread_ids(pid, proc_root=proc_root) if tid not in seen]
        if not new:
            break
        for tid in new:
            seen.add(tid)
            try:
                set_affinity(tid, cpus)
            except ProcessLookupError:
                continue
            except OSError as exc:
                failures.append(f"thread {tid}: {exc}")
                continue
            pinned += 1
    return pinned, failures


def pin_engine_core(
    api_pid: int,
    *,
    proc_root: Path = PROC,
    get_affinity: GetAffinity = os.sched_getaffinity,
    set_affinity: SetAffinity = os.sched_setaffinity,
) -> set[int] | None:
    """Pin the EngineCore of the vLLM API server `api_pid` to its Worker's CPUs. Returns the
    CPUs it was pinned to, or None if nothing was changed (which is logged, never raised)."""
    try:
        return _pin_engine_core(
            api_pid, proc_root=proc_root, get_affinity=get_affinity, set_affinity=set_affinity
        )
    except Exception as exc:  # an optimisation must never fail the engine start
        log.warning("engine %d: EngineCore not pinned: %s", api_pid, exc)
        return None


def _pin_engine_core(
    api_pid: int, *, proc_root: Path, get_affinity: GetAffinity, set_affinity: SetAffinity
) -> set[int] | None:
    found = find_engine_processes(api_pid, proc_root=proc_root)
    if not found.engine_cores or not found.workers:
        log.warning(
            "engine %d: EngineCore not pinned: no %s and %s process below it (found %s)",
            api_pid,
            ENGINE_CORE_COMM,
            WORKER_COMM,
            found,
        )
        return None
    worker_cpus: set[int] = set()
    for worker in found.workers:
        worker_cpus |= process_cpus(worker, proc_root=proc_root, get_affinity=get_affinity)
    pinned_to: set[int] | None = None
    for core in found.engine_cores:
        core_cpus = process_cpus(core, proc_root=proc_root, get_affinity=get_affinity)
        if core_cpus <= worker_cpus:
            log.info(
                "engine %d: EngineCore %d left as it is: its CPUs %s are within its Worker's %s",
                api_pid,
                core,
                _cpu_list(core_cpus),
                _cpu_list(worker_cpus),
            )
            continue
        pinned, failures = pin_threads(
            core, worker_cpus, proc_root=proc_root, set_affinity=set_affinity
        )
        if failures:
            log.warning(
                "engine %d: EngineCore %d: %d threads pinned to CPUs %s; not pinned: %s",
                api_pid,
                core,
                pinned,
                _cpu_list(worker_cpus),
                "; ".join(failures),
            )
        else:
            log.info(
                "engine %d: EngineCore %d (%d threads) pinned to its Worker's CPUs %s",
                api_pid,
                core,
                pinned,
                _cpu_list(worker_cpus),
            )
        if pinned:
            pinned_to = worker_cpus
    return pinned_to


def _cpu_list(cpus: set[int]) -> str:
    return ",".join(str(cpu) for cpu in sorted(cpus))
