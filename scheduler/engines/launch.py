"""The command line and environment that start a vLLM engine. Pure, so it is tested
without starting anything.

GPU: the engine sees only its card (CUDA_VISIBLE_DEVICES) and `--gpu-memory-utilization` is
its units as a fraction of the card's memory. CPU: `VLLM_CPU_KVCACHE_SPACE` (whole GiB) is
its units, and where a node runs several CPU engines each binds its model to cores of its own
(`VLLM_CPU_OMP_THREADS_BIND`, cpu_cores). vLLM's distribution on CPU is named `vllm-cpu`, so
the `vllm` CLI fails on its own version lookup; `python -m vllm.entrypoints.openai.api_server`
works for both builds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from capacity.units import GIB, UNIT_BYTES, gpu_memory_utilization
from scheduler.engines.cpu_cores import OMP_BIND_ENV, omp_threads_bind

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# The gate in front of every route of the engine (engine_side/gpushare_engine_gate.py): vLLM's
# own key check covers only its API prefixes. Its directory holds nothing else and is the
# engine's whole PYTHONPATH, so the engine imports none of the platform's packages.
ENGINE_SIDE_DIR = Path(__file__).resolve().parent / "engine_side"
GATE_MIDDLEWARE = "gpushare_engine_gate.EngineKeyGate"
CPU_UNITS_PER_GIB = GIB // UNIT_BYTES

# What an engine's process inherits of the platform's environment: what the system, Python,
# the model runtime and its caches read, and nothing else. The platform's own settings
# (DATABASE_URL with its password, REDIS_URL, DJANGO_SECRET_KEY, GPUSHARE_*, storage keys)
# never reach a process that runs tenants' requests.
ENGINE_ENV_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
    "LD_LIBRARY_PATH", "LD_PRELOAD", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
    "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
})  # fmt: skip
ENGINE_ENV_PREFIXES = (
    "LC_", "XDG_", "VLLM_", "HF_", "HUGGING_FACE_", "TRANSFORMERS_", "TORCH", "PYTORCH_",
    "CUDA_", "NVIDIA_", "NCCL_", "TRITON_", "KMP_", "OMP_", "ONEDNN_", "DNNL_",
)  # fmt: skip


def engine_env(base_env: Mapping[str, str]) -> dict[str, str]:
    """`base_env` less everything an engine has no business seeing (ENGINE_ENV_NAMES)."""
    return {
        name: value
        for name, value in base_env.items()
        if name in ENGINE_ENV_NAMES or name.startswith(ENGINE_ENV_PREFIXES)
    }


# Nothing can be downloaded and nothing should be phoned home.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "PYTHONUNBUFFERED": "1",
}


@dataclass(frozen=True)
class EngineLaunch:
    """What the supervisor knows about an engine, in plain values."""

    model_path: str
    served_model_name: str
    host: str
    port: int
    max_model_len: int
    max_num_seqs: int
    footprint_units: int
    device_kind: str  # "gpu" or "cpu"
    device_index: int
    device_memory_bytes: int
    task: str = "generate"  # or "embed" (scheduler.models.EngineTask)
    max_loras: int = 0  # adapters loaded at once; 0: LoRA off
    max_lora_rank: int = 16
    kv_blocks: int = 0  # its KV cache in blocks (GPUSHARE_ENGINE_KV_BLOCKS); 0: its footprint's
    cpu_cores: tuple[int, ...] = ()  # a CPU engine's cores (cpu_cores.engine_cores); (): vLLM's


@dataclass(frozen=True)
class LaunchSpec:
    argv: list[str]
    env: dict[str, str]


def cpu_kvcache_gib(footprint_units: int) -> int:
    if footprint_units < CPU_UNITS_PER_GIB or footprint_units % CPU_UNITS_PER_GIB:
        raise ValueError(
            f"a CPU engine's KV space is whole GiB: {footprint_units} units is not a "
            f"multiple of {CPU_UNITS_PER_GIB}"
        )
    return footprint_units // CPU_UNITS_PER_GIB


def build_launch(
    launch: EngineLaunch,
    *,
    python: str,
    base_env: Mapping[str, str],
    api_key: str,
    home: str | None = None,
    metrics_token: str = "",
) -> LaunchSpec:
    """The engine's command line and environment. `api_key` (scheduler.engines.auth) goes in
    the environment, where only the engine's user can read it, not on the command line;
    vLLM checks it under its API prefixes and the gate (GATE_MIDDLEWARE) on every other
    route but /health. `home`: the engine's HOME where it runs as a user of its own (its
    caches go there), instead of the platform's. `metrics_token`: what else opens the
    engine's /metrics, and nothing more (GPUSHARE_ENGINE_METRICS_TOKEN)."""
    argv = [
        python,
        "-m",
        API_SERVER_MODULE,
        "--model",
        launch.model_path,
        "--served-model-name",
        launch.served_model_name,
        "--host",
        launch.host,
        "--port",
        str(launch.port),
        "--max-model-len",
        str(launch.max_model_len),
        "--max-num-seqs",
        str(launch.max_num_seqs),
        # Requests waiting in the engine for a seat take it by their class (ENGINE_PRIORITY).
        "--scheduling-policy",
        "priority",
        "--middleware",
        GATE_MIDDLEWARE,
        # Its usage says how many prompt tokens its prefix cache held (`cached_tokens`): the
        # usage ledger's, and each tenant's prefix-cache hit rate.
        "--enable-prompt-tokens-details",
    ]
    if launch.kv_blocks > 0:
        argv += ["--num-gpu-blocks-override", str(launch.kv_blocks)]
    if launch.task == "embed":
        # vLLM's pooling runner serves /v1/embeddings; a generative checkpoint is adapted to
        # embed (its default conversion), an embedding model runs as it is.
        argv += ["--runner", "pooling"]
    if launch.max_loras > 0:
        # The platform loads and unloads adapters at run time (scheduler.adapters.loading),
        # never more than max_loras at once; the engine's CPU cache holds as many.
        argv += [
            "--enable-lora",
            "--max-loras",
            str(launch.max_loras),
            "--max-cpu-loras",
            str(launch.max_loras),
            "--max-lora-rank",
            str(launch.max_lora_rank),
        ]
    env = {
        **engine_env(base_env),
        **OFFLINE_ENV,
        "VLLM_API_KEY": api_key,
        # Only the gate's directory is importable besides the engine's own Python; and not
        # the working directory, which `python -m` would put first on sys.path.
        "PYTHONPATH": str(ENGINE_SIDE_DIR),
        "PYTHONSAFEPATH": "1",
    }
    if launch.max_loras > 0:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"  # /v1/load_lora_adapter and unload
    if home is not None:
        env["HOME"] = home
    if metrics_token:
        env["GPUSHARE_ENGINE_METRICS_TOKEN"] = metrics_token
    if launch.device_kind == "gpu":
        fraction = gpu_memory_utilization(
            footprint_units=launch.footprint_units,
            gpu_memory_bytes=launch.device_memory_bytes,
        )
        argv += ["--gpu-memory-utilization", f"{fraction}"]
        env["CUDA_VISIBLE_DEVICES"] = str(launch.device_index)
    elif launch.device_kind == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(cpu_kvcache_gib(launch.footprint_units))
        if launch.cpu_cores and OMP_BIND_ENV not in env:  # an operator's binding stays
            env[OMP_BIND_ENV] = omp_threads_bind(launch.cpu_cores)
    else:
        raise ValueError(f"unknown device kind {launch.device_kind!r}")
    return LaunchSpec(argv=argv, env=env)
