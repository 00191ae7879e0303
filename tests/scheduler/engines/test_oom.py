"""Which engine deaths are out of memory (`oom_cause`, from the log's end, the exit code and
whether the platform asked the engine to stop), and their count in Redis. The supervisor's
path, with a real process that runs out of memory, is in test_supervisor.py."""

from __future__ import annotations

import logging
import signal

import pytest
import redis

from scheduler.engines.oom import (
    KILLED_CAUSE,
    START_MARKER,
    engine_oom_counts,
    engine_oom_note,
    oom_cause,
)

# The ends of logs as vLLM and torch write them.
TORCH_OOM = """\
(EngineCore_DP0 pid=2201) ERROR 05-02 10:11:12 [core.py:710] EngineCore encountered a fatal error.
(EngineCore_DP0 pid=2201) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. \
GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free.
(APIServer pid=2150) ERROR 05-02 10:11:12 [async_llm.py:480] AsyncLLM output_handler failed.
(APIServer pid=2150) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.
(APIServer pid=2150) INFO:     Shutting down
"""
OLD_TORCH_OOM = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB\n"
RAW_CUDA_OOM = "RuntimeError: CUDA error: out of memory\n"
NO_KV_MEMORY = (
    "(EngineCore_DP0 pid=9) ValueError: No available memory for the cache blocks. Try "
    "increasing `gpu_memory_utilization` when initializing the engine.\n"
)
KV_TOO_SMALL = (
    "ValueError: To serve at least one request with the model's max seq len (40960), (5.62 GiB "
    "KV cache is needed, which is larger than the available KV cache memory (4.50 GiB). Try "
    "increasing `gpu_memory_utilization` or decreasing `max_model_len`\n"
)
GPU_TAKEN = (
    "ValueError: Free memory on device cuda:0 (12.18/79.19 GiB) on startup is less than "
    "desired GPU memory utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or "
    "reduce GPU memory used by other processes.\n"
)
OTHER_ERROR = "RuntimeError: fake engine could not load the model\n"


@pytest.mark.parametrize(
    ("tail", "cause"),
    [
        (TORCH_OOM, "CUDA out of memory"),
        (OLD_TORCH_OOM, "CUDA out of memory"),
        (RAW_CUDA_OOM, "CUDA out of memory"),
        (NO_KV_MEMORY, "no memory left for the KV cache"),
        (KV_TOO_SMALL, "no memory left for the KV cache"),
        (GPU_TAKEN, "the GPU's free memory is below what the engine asks for"),
    ],
)
def test_an_engine_whose_log_says_memory_ran_out_died_of_it(tail: str, cause: str) -> None:
    assert oom_cause(log_tail=tail, exit_code=1, stop_requested=False) == cause
    # An engine this process did not start: its exit code is unknown, its log is not.
    assert oom_cause(log_tail=tail, exit_code=None, stop_requested=False) == cause


def test_other_failures_are_not_out_of_memory() -> None:
    assert oom_cause(log_tail=OTHER_ERROR, exit_code=3, stop_requested=False) is None
    assert oom_cause(log_tail="", exit_code=None, stop_requested=False) is None
    assert oom_cause(log_tail=OTHER_ERROR, exit_code=-signal.SIGSEGV, stop_requested=False) is None


def test_a_sigkill_the_platform_did_not_send_is_the_oom_killer() -> None:
    for code in (-signal.SIGKILL, 128 + signal.SIGKILL):
        assert oom_cause(log_tail="INFO: serving", exit_code=code, stop_requested=False) == (
            KILLED_CAUSE
        )


def test_an_engine_the_platform_stopped_did_not_run_out_of_memory() -> None:
    # Its stop ends in SIGKILL after the stop timeout; whatever it printed then is no OOM.
    assert oom_cause(log_tail="", exit_code=-signal.SIGKILL, stop_requested=True) is None
    assert oom_cause(log_tail=TORCH_OOM, exit_code=1, stop_requested=True) is None


def test_a_clean_exit_is_never_out_of_memory() -> None:
    assert oom_cause(log_tail=TORCH_OOM, exit_code=0, stop_requested=False) is None


def test_only_the_latest_run_of_the_log_counts() -> None:
    earlier = f"{START_MARKER}e1: python -m vllm...\n{TORCH_OOM}"
    latest = f"{START_MARKER}e1: python -m vllm...\n{OTHER_ERROR}"
    assert oom_cause(log_tail=earlier + latest, exit_code=3, stop_requested=False) is None
    assert oom_cause(log_tail=latest + earlier, exit_code=1, stop_requested=False) == (
        "CUDA out of memory"
    )


def test_a_death_is_counted_once_by_engine_and_model_and_logged(
    redis_db: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="scheduler.engines.oom")
    assert engine_oom_note(engine="e1", model="m", run="41:1.0", cause="CUDA out of memory")
    # A second process that sees the same run die counts nothing, nor logs it again.
    assert not engine_oom_note(engine="e1", model="m", run="41:1.0", cause="CUDA out of memory")
    assert engine_oom_note(engine="e1", model="m", run="77:9.0", cause="CUDA out of memory")
    assert engine_oom_note(engine="e2", model="m", run="41:1.0", cause=KILLED_CAUSE)
    assert engine_oom_counts() == {("e1", "m"): 2, ("e2", "m"): 1}
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.ERROR, "engine e1 (m) ran out of memory: CUDA out of memory"),
        (logging.ERROR, "engine e1 (m) ran out of memory: CUDA out of memory"),
        (logging.ERROR, f"engine e2 (m) ran out of memory: {KILLED_CAUSE}"),
    ]


def test_without_redis_a_death_is_logged_and_nothing_raises(
    settings, caplog: pytest.LogCaptureFixture
) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    with caplog.at_level(logging.ERROR, logger="scheduler.engines.oom"):
        assert not engine_oom_note(engine="e1", model="m", run="1:", cause="CUDA out of memory")
    assert "engine e1 ran out of memory (CUDA out of memory); could not count it" in caplog.text
