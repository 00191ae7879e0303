"""The engine supervisor with a stand-in vLLM server: lifecycle, failures, crash detection.

The real vLLM CPU engine is driven by tests/e2e/test_engine_vllm_cpu.py.
"""

import json
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from capacity.units import GIB
from plumbing.errors import DomainError
from scheduler.engines import cpu_affinity, oom, process
from scheduler.engines.supervisor import (
    EngineStartError,
    Timeouts,
    _death_detail,
    _pin_cpu_engine_core,
    engine_cpu_cores,
    engine_health_check,
    engine_refresh,
    engine_start,
    engine_stop,
    engine_work_dir,
    engines_check_all,
)
from scheduler.models import Device, DeviceKind, Engine, EngineStatus
from scheduler.services import NoRoom, device_register_cpu, engine_create, engine_set_status

FAKE_SERVER = Path(__file__).parents[2] / "support" / "fake_vllm_server.py"
FAST = Timeouts(start_s=20, drain_s=2, stop_s=5, http_s=2, generate_s=5)
NODE = "testnode"

pytestmark = pytest.mark.django_db


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kill_and_wait(pid: int) -> None:
    """SIGKILL to the engine's process group, then until the process is gone (10 s at most)."""
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while process.is_running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def pid_of(engine: Engine) -> int:
    assert engine.pid is not None, f"{engine.name} has no process"
    return engine.pid


@pytest.fixture
def fake_vllm(tmp_path: Path, settings, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An 'interpreter' that runs the fake server with vLLM's command line."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE_SERVER} "$@"\n')
    wrapper.chmod(0o755)
    settings.GPUSHARE_VLLM_PYTHON = str(wrapper)
    settings.GPUSHARE_ENGINE_DIR = tmp_path / "engines"
    settings.GPUSHARE_NODE_NAME = NODE
    monkeypatch.setenv("VLLM_FAKE_MODE", "ok")
    return wrapper


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    return model


@pytest.fixture
def cpu(db: None) -> Device:
    return device_register_cpu(node=NODE, kvcache_gib=2)


def register(name: str, cpu: Device, model_dir: Path, served: str = "tiny") -> Engine:
    return engine_create(
        name=name,
        model_path=str(model_dir),
        served_model_name=served,
        footprint_units=4,
        port=free_port(),
        device=cpu,
    )


@pytest.fixture
def engine(cpu: Device, model_dir: Path, fake_vllm: Path):
    created = register("fake", cpu, model_dir)
    yield created
    created.refresh_from_db()
    if created.pid and process.is_running(created.pid):
        process.terminate(created.pid, timeout_s=5)


def test_it_starts_an_engine_through_warming_to_ready_with_its_kv_capacity(engine) -> None:
    progress: list[str] = []
    started = engine_start(name="fake", on_progress=progress.append, timeouts=FAST)
    assert started.status == EngineStatus.READY
    assert started.kv_capacity_tokens == 64 * 16
    assert started.block_size == 16
    assert process.is_engine_process(pid_of(started), port=started.port)
    assert any("warming" in line for line in progress)
    assert "KV capacity 1024 tokens" in progress[-1]
    # A second start finds it ready and launches nothing.
    again = engine_start(name="fake", timeouts=FAST)
    assert again.pid == started.pid


def test_a_cpu_engine_has_its_engine_core_pinned_once_it_answers(
    engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    pinned: list[tuple[int, str]] = []

    def record(pid: int) -> None:
        pinned.append((pid, Engine.objects.get(pk=engine.pk).status))

    monkeypatch.setattr(cpu_affinity, "pin_engine_core", record)
    started = engine_start(name="fake", timeouts=FAST)
    assert pinned == [(pid_of(started), EngineStatus.STARTING)]  # before the warm-up


def test_the_cpu_engines_of_a_node_bind_to_cores_of_their_own(
    engine, cpu: Device, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert engine_cpu_cores(engine) == ()  # alone on the node: vLLM's own binding
    second = register("fake-2", cpu, model_dir, served="tiny-2")
    assert engine_cpu_cores(engine) == (0,)  # 4 CPUs, one kept: one each
    assert engine_cpu_cores(second) == (1,)


def test_a_cpu_engine_without_vllm_child_processes_starts_with_a_warning(
    engine, caplog: pytest.LogCaptureFixture
) -> None:
    # The stand-in server has no EngineCore or Worker: nothing to pin, and no failure.
    with caplog.at_level(logging.WARNING, logger=cpu_affinity.__name__):
        started = engine_start(name="fake", timeouts=FAST)
    assert started.status == EngineStatus.READY
    assert "EngineCore not pinned" in caplog.text


def test_a_gpu_engines_processes_are_left_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    pinned: list[int] = []
    monkeypatch.setattr(cpu_affinity, "pin_engine_core", pinned.append)
    _pin_cpu_engine_core(Engine(device=Device(kind=DeviceKind.GPU), pid=4321))
    assert pinned == []
    _pin_cpu_engine_core(Engine(device=Device(kind=DeviceKind.CPU), pid=4321))
    assert pinned == [4321]


def proc_ids(pid: int) -> dict[str, list[int]]:
    """Uid, Gid and Groups of /proc/<pid>/status."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {
        name: [int(value) for value in rest.split()]
        for name, _, rest in (line.partition(":") for line in lines)
        if name in ("Uid", "Gid", "Groups")
    }


def test_an_engine_works_in_a_directory_of_its_own_not_the_repository(engine, settings) -> None:
    started = engine_start(name="fake", timeouts=FAST)
    cwd = Path(os.readlink(f"/proc/{pid_of(started)}/cwd"))
    assert cwd == engine_work_dir(started).resolve()
    assert cwd != Path(settings.BASE_DIR).resolve()
    assert Path(settings.BASE_DIR).resolve() not in cwd.parents
    assert stat.S_IMODE(cwd.stat().st_mode) == 0o700
    environ = Path(f"/proc/{pid_of(started)}/environ").read_bytes().split(b"\0")
    assert b"PYTHONSAFEPATH=1" in environ  # nor is its working directory on its sys.path


SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user may enter (pytest's tmp_path is its user's only)."""
    path = Path(tempfile.mkdtemp(prefix="gpushare-engine-user-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root starts a process as another user")
def test_an_engine_runs_as_the_configured_user_with_its_groups_only(
    engine, settings, shared_dir: Path
) -> None:
    # The engine's user must be able to run its Python: the system's, where this one is in
    # a home of root's (the stand-in server needs the standard library only).
    python = SYSTEM_PYTHON if os.access(SYSTEM_PYTHON, os.X_OK) else sys.executable
    wrapper = shared_dir / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {python} {FAKE_SERVER} "$@"\n')
    wrapper.chmod(0o755)
    settings.GPUSHARE_VLLM_PYTHON = str(wrapper)
    settings.GPUSHARE_ENGINE_DIR = shared_dir / "engines"
    settings.GPUSHARE_ENGINE_USER = "nobody"
    settings.GPUSHARE_ENGINE_GROUPS = ["nogroup"]
    secret = shared_dir / "secret_key"
    secret.write_text("the platform's")
    secret.chmod(0o600)
    started = engine_start(name="fake", timeouts=FAST)
    assert started.status == EngineStatus.READY
    nobody = process.run_as("nobody")
    assert nobody is not None
    ids = proc_ids(pid_of(started))
    assert set(ids["Uid"]) == {nobody.uid}
    assert set(ids["Gid"]) == {nobody.gid}
    assert set(ids["Groups"]) <= {nobody.gid}  # root's own groups are dropped
    work = engine_work_dir(started)
    assert work.stat().st_uid == nobody.uid
    environ = Path(f"/proc/{pid_of(started)}/environ").read_bytes().split(b"\0")
    assert f"HOME={work}".encode() in environ
    # As its own user, it reads none of the platform's files.
    peek = subprocess.run(
        ["cat", str(secret)], user=nobody.uid, group=nobody.gid, extra_groups=[],
        capture_output=True, check=False,
    )  # fmt: skip
    assert peek.returncode != 0


def test_an_engine_user_that_cannot_be_switched_to_is_a_start_error(engine, settings) -> None:
    settings.GPUSHARE_ENGINE_USER = "no-such-user-here"
    with pytest.raises(EngineStartError, match="GPUSHARE_ENGINE_USER: no user"):
        engine_start(name="fake", timeouts=FAST)
    settings.GPUSHARE_ENGINE_USER = "root"
    with pytest.raises(EngineStartError, match="may not run as root"):
        engine_start(name="fake", timeouts=FAST)


def test_it_drains_then_stops_and_the_process_is_gone(engine) -> None:
    started = engine_start(name="fake", timeouts=FAST)
    progress: list[str] = []
    stopped = engine_stop(name="fake", on_progress=progress.append, timeouts=FAST)
    assert stopped.status == EngineStatus.STOPPED
    assert stopped.pid is None
    assert not process.is_running(pid_of(started))
    assert progress[:2] == ["fake: draining (up to 2 s)", "fake: drained"]


def test_an_engine_that_dies_during_start_is_marked_failed_with_its_log(
    engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_FAKE_MODE", "die")
    with pytest.raises(EngineStartError, match="died while starting") as failed:
        engine_start(name="fake", timeouts=FAST)
    assert "exit code 3" in failed.value.message
    assert "could not load the model" in failed.value.message
    engine.refresh_from_db()
    assert engine.status == EngineStatus.FAILED
    assert "could not load the model" in engine.status_detail
    assert engine.pid is None


def test_an_engine_without_kv_capacity_in_its_metrics_is_not_ready(
    engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_FAKE_MODE", "no_metrics")
    with pytest.raises(EngineStartError, match="cache_config_info"):
        engine_start(name="fake", timeouts=FAST)
    engine.refresh_from_db()
    assert engine.status == EngineStatus.FAILED


def test_a_crashed_engine_is_detected_and_never_left_ready(engine) -> None:
    started = engine_start(name="fake", timeouts=FAST)
    kill_and_wait(pid_of(started))
    checked = engine_refresh(engine=Engine.objects.get(name="fake"))
    assert checked.status == EngineStatus.FAILED
    assert f"process {started.pid} is gone while ready" in checked.status_detail
    # Stopping a failed engine settles it as stopped.
    assert engine_stop(name="fake", timeouts=FAST).status == EngineStatus.STOPPED


def test_a_crash_check_that_read_the_row_before_a_stop_leaves_it_stopped(engine) -> None:
    started = engine_start(name="fake", timeouts=FAST)
    read_before = Engine.objects.get(name="fake")  # the periodic check's row, still ready
    assert engine_stop(name="fake", timeouts=FAST).status == EngineStatus.STOPPED
    assert not process.is_running(pid_of(started))
    checked = engine_refresh(engine=read_before)
    assert checked.status == EngineStatus.STOPPED
    assert Engine.objects.get(name="fake").status == EngineStatus.STOPPED


def test_a_process_gone_after_the_stop_sent_sigterm_is_stopped_not_failed(engine) -> None:
    started = engine_start(name="fake", timeouts=FAST)
    engine_set_status(
        engine=started, status=EngineStatus.DRAINING, detail=f"stopping process {started.pid}"
    )
    kill_and_wait(pid_of(started))
    checked = engine_refresh(engine=Engine.objects.get(name="fake"))
    assert checked.status == EngineStatus.STOPPED
    assert Engine.objects.get(name="fake").pid is None


def test_a_ready_engine_that_stops_answering_health_is_failed_and_its_process_stopped(
    engine, settings
) -> None:
    settings.GPUSHARE_ENGINE_HEALTH_MISSES = 2
    started = engine_start(name="fake", timeouts=FAST)
    os.kill(pid_of(started), signal.SIGSTOP)  # alive, but deaf
    try:
        once = engine_health_check(engine=Engine.objects.get(name="fake"), timeouts=FAST)
        assert once.status == EngineStatus.READY  # one miss may be a stall
        assert Engine.objects.get(name="fake").health_misses == 1
        twice = engine_health_check(engine=Engine.objects.get(name="fake"), timeouts=FAST)
    finally:
        if process.is_running(pid_of(started)):
            os.kill(pid_of(started), signal.SIGCONT)
    assert twice.status == EngineStatus.FAILED
    assert "did not answer 200 in 2 checks in a row" in twice.status_detail
    # Stopped, so that its port and memory are free for the next start.
    assert not process.is_running(pid_of(started))
    assert f"its process {started.pid} was killed" in twice.status_detail
    assert Engine.objects.get(name="fake").pid is None


def test_an_engine_that_answers_again_is_forgiven_its_misses(engine, settings) -> None:
    settings.GPUSHARE_ENGINE_HEALTH_MISSES = 2
    started = engine_start(name="fake", timeouts=FAST)
    os.kill(pid_of(started), signal.SIGSTOP)
    try:
        engine_health_check(engine=Engine.objects.get(name="fake"), timeouts=FAST)
    finally:
        os.kill(pid_of(started), signal.SIGCONT)
    answered = engine_health_check(engine=Engine.objects.get(name="fake"), timeouts=FAST)
    assert answered.status == EngineStatus.READY
    assert Engine.objects.get(name="fake").health_misses == 0
    # So the next single miss does not fail it either.
    os.kill(pid_of(started), signal.SIGSTOP)
    try:
        missed = engine_health_check(engine=Engine.objects.get(name="fake"), timeouts=FAST)
    finally:
        os.kill(pid_of(started), signal.SIGCONT)
    assert missed.status == EngineStatus.READY
    assert process.is_engine_process(pid_of(started), port=started.port)


def test_stopping_a_failed_engine_whose_process_still_runs_stops_the_process(engine) -> None:
    started = engine_start(name="fake", timeouts=FAST)
    # As an older version left a deaf engine: failed, its process running.
    Engine.objects.filter(name="fake").update(status=EngineStatus.FAILED)
    stopped = engine_stop(name="fake", timeouts=FAST)
    assert stopped.status == EngineStatus.STOPPED
    assert stopped.pid is None
    assert not process.is_running(pid_of(started))


def test_without_a_vllm_environment_start_says_to_run_setup(engine, settings, tmp_path) -> None:
    settings.GPUSHARE_VLLM_PYTHON = ""
    settings.GPUSHARE_CACHE_DIR = tmp_path / "empty-cache"
    with pytest.raises(EngineStartError, match=r"run scripts/setup_vllm\.sh"):
        engine_start(name="fake", timeouts=FAST)


def test_start_refuses_when_running_engines_leave_no_room(engine, cpu, model_dir) -> None:
    other = engine_create(
        name="other",
        model_path=str(model_dir),
        served_model_name="x",
        footprint_units=4,
        port=free_port(),
        device=cpu,
    )
    # Both fit the plan (8 units); squeeze the device as if the operator lowered its KV space.
    Engine.objects.filter(pk=other.pk).update(status=EngineStatus.READY)
    Device.objects.filter(pk=cpu.pk).update(capacity_units=6, memory_bytes=int(1.5 * GIB))
    with pytest.raises(NoRoom, match="short by 2 units"):
        engine_start(name="fake", timeouts=FAST)


def test_an_engine_on_another_node_is_not_started_here(engine, settings) -> None:
    settings.GPUSHARE_NODE_NAME = "elsewhere"
    with pytest.raises(DomainError, match="start it on node 'testnode'"):
        engine_start(name="fake", timeouts=FAST)


def test_the_periodic_check_finds_the_dead_engines_of_this_node(engine) -> None:
    started = engine_start(name="fake", timeouts=FAST)
    assert engines_check_all(timeouts=FAST) == []
    kill_and_wait(pid_of(started))
    assert [e.name for e in engines_check_all(timeouts=FAST)] == ["fake"]


def test_an_engine_that_finds_no_memory_for_its_kv_cache_fails_out_of_memory_counted(
    engine, redis_db, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("VLLM_FAKE_MODE", "no_kv_memory")
    with (
        caplog.at_level(logging.ERROR, logger=oom.__name__),
        pytest.raises(EngineStartError, match="died while starting"),
    ):
        engine_start(name="fake", timeouts=FAST)
    engine.refresh_from_db()
    assert engine.status == EngineStatus.FAILED
    assert engine.status_detail.startswith("out of memory (no memory left for the KV cache): ")
    assert "No available memory for the cache blocks" in engine.status_detail
    assert oom.engine_oom_counts() == {("fake", "tiny"): 1}
    assert "engine fake (tiny) ran out of memory" in caplog.text
    # The next start dies of something else: the earlier run's words in the log are not its.
    monkeypatch.setenv("VLLM_FAKE_MODE", "die")
    with pytest.raises(EngineStartError, match="could not load the model") as failed:
        engine_start(name="fake", timeouts=FAST)
    assert not failed.value.message.startswith("out of memory")
    assert oom.engine_oom_counts() == {("fake", "tiny"): 1}


def test_a_ready_engine_that_runs_out_of_memory_is_failed_and_counted_once(
    engine, redis_db
) -> None:
    started = engine_start(name="fake", timeouts=FAST)
    os.kill(pid_of(started), signal.SIGUSR1)  # it prints torch's OOM error and exits 1
    deadline = time.monotonic() + 10
    while process.is_running(pid_of(started)) and time.monotonic() < deadline:
        time.sleep(0.1)
    # A start's wait and the crash check may both see one death: one count between them.
    assert _death_detail(Engine.objects.get(name="fake"), "seen").startswith("out of memory")
    checked = engine_refresh(engine=Engine.objects.get(name="fake"))
    assert checked.status == EngineStatus.FAILED
    assert checked.status_detail.startswith("out of memory (CUDA out of memory): ")
    assert f"process {started.pid} is gone while ready (exit code 1)" in checked.status_detail
    assert "torch.OutOfMemoryError: CUDA out of memory" in checked.status_detail
    assert engine_stop(name="fake", timeouts=FAST).status == EngineStatus.STOPPED
    assert oom.engine_oom_counts() == {("fake", "tiny"): 1}


def test_an_engine_killed_by_a_sigkill_nobody_here_sent_is_counted_as_the_oom_killer(
    engine, redis_db
) -> None:
    started = engine_start(name="fake", timeouts=FAST)
    kill_and_wait(pid_of(started))
    checked = engine_refresh(engine=Engine.objects.get(name="fake"))
    assert checked.status_detail.startswith(f"out of memory ({oom.KILLED_CAUSE}): ")
    assert "(exit code -9)" in checked.status_detail
    assert oom.engine_oom_counts() == {("fake", "tiny"): 1}


def test_an_engine_the_platform_stops_or_that_fails_otherwise_is_not_out_of_memory(
    engine, redis_db, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine_start(name="fake", timeouts=FAST)
    assert engine_stop(name="fake", timeouts=FAST).status == EngineStatus.STOPPED
    monkeypatch.setenv("VLLM_FAKE_MODE", "die")
    with pytest.raises(EngineStartError):
        engine_start(name="fake", timeouts=FAST)
    engine.refresh_from_db()
    assert not engine.status_detail.startswith("out of memory")
    assert oom.engine_oom_counts() == {}
