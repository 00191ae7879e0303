"""Pinning a CPU engine's EngineCore to its Worker's CPUs: the processes chosen from a fake
/proc tree, failures swallowed, and real threads of real processes pinned."""

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from scheduler.engines import cpu_affinity
from scheduler.engines.cpu_affinity import (
    EngineProcesses,
    descendants,
    find_engine_processes,
    pin_engine_core,
    pin_threads,
)

API, CORE, WORKER, OTHER, GRANDCHILD, STRANGER = 100, 110, 120, 130, 140, 900


def add_process(root: Path, pid: int, *, ppid: int, comm: str, threads: Iterable[int] = ()) -> None:
    folder = root / str(pid)
    (folder / "task").mkdir(parents=True)
    (folder / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 0\n")
    (folder / "comm").write_text(comm + "\n")
    for tid in (pid, *threads):
        (folder / "task" / str(tid)).mkdir()


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """API server 100 -> EngineCore 110 (threads 111, 112) -> Worker 120 (thread 121); the
    API server also has a helper 130 whose child 140 is not vLLM; 900 is someone else's
    EngineCore."""
    root = tmp_path / "proc"
    root.mkdir()
    add_process(root, 1, ppid=0, comm="init")
    add_process(root, API, ppid=1, comm="python")
    add_process(root, CORE, ppid=API, comm="VLLM::EngineCor", threads=(111, 112))
    add_process(root, WORKER, ppid=CORE, comm="VLLM::Worker", threads=(121,))
    add_process(root, OTHER, ppid=API, comm="python3")
    add_process(root, GRANDCHILD, ppid=OTHER, comm="sh")
    add_process(root, STRANGER, ppid=1, comm="VLLM::EngineCor")
    (root / "self").mkdir()  # not a pid: skipped
    (root / "meminfo").write_text("MemTotal: 1 kB\n")
    return root


class FakeAffinity:
    """sched_getaffinity / sched_setaffinity over a table of thread ids."""

    def __init__(self, cpus: dict[int, set[int]], *, refuse: type[OSError] | None = None):
        self.cpus = cpus
        self.refuse = refuse
        self.set_calls: list[tuple[int, set[int]]] = []

    def get(self, tid: int) -> set[int]:
        if tid not in self.cpus:
            raise ProcessLookupError(tid)
        return set(self.cpus[tid])

    def set(self, tid: int, cpus: Iterable[int]) -> None:
        self.set_calls.append((tid, set(cpus)))
        if self.refuse is not None:
            raise self.refuse(1, "refused")
        if tid not in self.cpus:
            raise ProcessLookupError(tid)
        self.cpus[tid] = set(cpus)


def unpinned_engine() -> FakeAffinity:
    """The Worker's threads are bound to CPU 0; the EngineCore may run anywhere of 0-3."""
    return FakeAffinity(
        {
            CORE: {0, 1, 2, 3},
            111: {0, 1, 2, 3},
            112: {0, 1, 2, 3},
            WORKER: {0},
            121: {0},
        }
    )


def pin(proc: Path, affinity: FakeAffinity) -> set[int] | None:
    return pin_engine_core(
        API, proc_root=proc, get_affinity=affinity.get, set_affinity=affinity.set
    )


def test_descendants_are_the_whole_subtree_and_nothing_else(proc: Path) -> None:
    assert descendants(API, proc_root=proc) == [CORE, WORKER, OTHER, GRANDCHILD]
    assert descendants(WORKER, proc_root=proc) == []


def test_the_engine_core_and_worker_are_chosen_by_name_below_the_api_server(proc: Path) -> None:
    assert find_engine_processes(API, proc_root=proc) == EngineProcesses(
        engine_cores=(CORE,), workers=(WORKER,)
    )


def test_a_command_name_with_spaces_and_parentheses_does_not_confuse_the_parent(
    proc: Path,
) -> None:
    add_process(proc, 150, ppid=CORE, comm="VLLM::Worker) 7 (x")
    assert find_engine_processes(API, proc_root=proc).workers == (WORKER, 150)


def test_tensor_parallel_workers_are_all_workers(proc: Path) -> None:
    add_process(proc, 150, ppid=CORE, comm="VLLM::Worker_TP1")
    assert find_engine_processes(API, proc_root=proc).workers == (WORKER, 150)


def test_every_engine_core_thread_gets_the_workers_cpus(proc: Path) -> None:
    affinity = unpinned_engine()
    assert pin(proc, affinity) == {0}
    assert affinity.set_calls == [(CORE, {0}), (111, {0}), (112, {0})]
    assert affinity.cpus[WORKER] == {0}  # the Worker is not touched


def test_the_workers_cpus_are_those_of_all_its_threads(proc: Path) -> None:
    # vLLM binds one OpenMP thread per core; the main thread is one of them.
    affinity = unpinned_engine()
    affinity.cpus[121] = {1}
    assert pin(proc, affinity) == {0, 1}
    assert affinity.cpus[111] == {0, 1}


def test_nothing_changes_when_the_worker_may_use_every_cpu_of_the_engine_core(
    proc: Path,
) -> None:
    affinity = unpinned_engine()
    affinity.cpus[WORKER] = affinity.cpus[121] = {0, 1, 2, 3}
    assert pin(proc, affinity) is None
    assert affinity.set_calls == []


def test_an_engine_core_already_pinned_is_left_alone(proc: Path) -> None:
    affinity = unpinned_engine()
    affinity.cpus.update({CORE: {0}, 111: {0}, 112: {0}})
    assert pin(proc, affinity) is None
    assert affinity.set_calls == []


def test_without_the_vllm_processes_it_warns_and_changes_nothing(
    proc: Path, caplog: pytest.LogCaptureFixture
) -> None:
    affinity = unpinned_engine()
    with caplog.at_level(logging.WARNING, logger=cpu_affinity.__name__):
        assert (
            pin_engine_core(
                OTHER, proc_root=proc, get_affinity=affinity.get, set_affinity=affinity.set
            )
            is None
        )
    assert affinity.set_calls == []
    assert "not pinned" in caplog.text


def test_a_refused_affinity_is_a_warning_not_an_error(
    proc: Path, caplog: pytest.LogCaptureFixture
) -> None:
    affinity = unpinned_engine()
    affinity.refuse = PermissionError
    with caplog.at_level(logging.WARNING, logger=cpu_affinity.__name__):
        assert pin(proc, affinity) is None
    assert len(affinity.set_calls) == 3  # it tried every thread
    assert "refused" in caplog.text


def test_a_thread_that_exits_meanwhile_is_skipped(proc: Path) -> None:
    affinity = unpinned_engine()
    del affinity.cpus[112]  # listed in /proc, gone by the time it is pinned
    assert pin(proc, affinity) == {0}
    assert affinity.cpus[CORE] == affinity.cpus[111] == {0}


def test_a_thread_started_while_pinning_is_pinned_too(proc: Path) -> None:
    affinity = unpinned_engine()
    plain_set = affinity.set

    def set_and_spawn(tid: int, cpus: Iterable[int]) -> None:
        plain_set(tid, cpus)
        if tid == CORE:  # the main thread starts 113 before it is pinned itself
            (proc / str(CORE) / "task" / "113").mkdir()
            affinity.cpus[113] = {0, 1, 2, 3}

    assert pin_threads(CORE, {0}, proc_root=proc, set_affinity=set_and_spawn) == (4, [])
    assert affinity.cpus[113] == {0}


def test_a_worker_whose_affinity_cannot_be_read_is_a_warning(
    proc: Path, caplog: pytest.LogCaptureFixture
) -> None:
    affinity = unpinned_engine()
    del affinity.cpus[WORKER], affinity.cpus[121]  # the Worker exited
    with caplog.at_level(logging.WARNING, logger=cpu_affinity.__name__):
        assert pin(proc, affinity) is None
    assert affinity.set_calls == []
    assert "not pinned" in caplog.text


def test_an_unexpected_error_is_swallowed(
    proc: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(cpu_affinity, "find_engine_processes", broken)
    with caplog.at_level(logging.WARNING, logger=cpu_affinity.__name__):
        assert pin(proc, unpinned_engine()) is None
    assert "boom" in caplog.text


def test_a_missing_proc_root_is_swallowed(tmp_path: Path) -> None:
    affinity = unpinned_engine()
    assert (
        pin_engine_core(
            API,
            proc_root=tmp_path / "absent",
            get_affinity=affinity.get,
            set_affinity=affinity.set,
        )
        is None
    )


# Real processes: a stand-in API server whose children name themselves like vLLM's.
NAME_AND_SLEEP = """
import ctypes, os, sys, threading, time
ctypes.CDLL(None).prctl(15, sys.argv[1].encode())  # PR_SET_NAME: /proc/<pid>/comm
if sys.argv[2] != "-":
    os.sched_setaffinity(0, {int(sys.argv[2])})
for _ in range(3):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
time.sleep(60)
"""
FAKE_API_SERVER = """
import subprocess, sys, time
child = [sys.executable, "-c", sys.argv[1]]
subprocess.Popen([*child, "VLLM::EngineCore", "-"])
subprocess.Popen([*child, "VLLM::Worker", sys.argv[2]])
time.sleep(60)
"""

needs_two_cpus = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux and at least 2 CPUs",
)


def threads_cpus(pid: int) -> list[set[int]]:
    return [os.sched_getaffinity(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")]


@pytest.fixture
def sleeper() -> Iterator[int]:
    child = subprocess.Popen(
        [sys.executable, "-c", NAME_AND_SLEEP, "sleeper", "-"], start_new_session=True
    )
    try:
        yield child.pid
    finally:
        child.kill()
        child.wait()


@needs_two_cpus
def test_pin_threads_pins_every_thread_of_a_real_process(sleeper: int) -> None:
    cpu = min(os.sched_getaffinity(0))
    deadline = time.monotonic() + 10
    while len(os.listdir(f"/proc/{sleeper}/task")) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(threads_cpus(sleeper)) == 4
    assert pin_threads(sleeper, {cpu}) == (4, [])
    assert threads_cpus(sleeper) == [{cpu}] * 4


@needs_two_cpus
def test_a_real_engine_core_gets_its_real_workers_cpu() -> None:
    allowed = os.sched_getaffinity(0)
    cpu = max(allowed)
    api = subprocess.Popen(
        [sys.executable, "-c", FAKE_API_SERVER, NAME_AND_SLEEP, str(cpu)],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            found = find_engine_processes(api.pid)
            if found.engine_cores and found.workers:
                core, worker = found.engine_cores[0], found.workers[0]
                if os.sched_getaffinity(worker) == {cpu} and len(threads_cpus(core)) == 4:
                    break
            time.sleep(0.05)
        else:
            pytest.fail(f"the stand-in engine did not come up: {find_engine_processes(api.pid)}")
        assert threads_cpus(core) == [allowed] * 4
        assert pin_engine_core(api.pid) == {cpu}
        assert threads_cpus(core) == [{cpu}] * 4
        assert os.sched_getaffinity(api.pid) == allowed  # the API server is not touched
    finally:
        os.killpg(api.pid, signal.SIGKILL)
        api.wait()
