"""Capacity planning from the formulas of the source design documents (docs/ARCHITECTURE.md,
"Where the numbers come from"). Pure Python: no Django, no database.

Two questions an operator asks before buying or placing cards:

1. Memory: how many requests of a given length run at once on one engine?
   usable GPU memory = weights + framework reserve + KV bytes per token x tokens x requests,
   where usable memory is the card's memory times the engine's utilisation fraction
   (vLLM's `--gpu-memory-utilization`). Each request reserves its worst case
   (prompt + max output, in whole KV blocks), exactly as the scheduler admits it.
2. Fleet: how many GPUs for a peak load?
   per-card throughput = effective utilisation x per-request throughput x safety factor
   (0.7-0.85), cards = peak QPS / per-card throughput, split into a hot pool (always on,
   about 70% of the daily peak) and a cold pool (started ahead of peaks) for the rest.

The KV bytes per token come from `capacity.kvcost`; amounts in units from `capacity.units`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from capacity.kvcost import DEFAULT_BLOCK_SIZE, KvShape, kv_cost_bytes, kv_shape_from_config
from capacity.units import (
    GIB,
    bytes_to_units_exact,
    bytes_to_units_floor,
    gib_to_bytes,
    gpu_memory_utilization,
)

# The source design documents: "安全系数(通常取0.7~0.85)" (a safety factor, usually 0.7 to 0.85)
# and "常驻热池按日均峰值的70%配置" (the resident hot pool sized at 70% of the daily peak).
SAFETY_FACTOR_RANGE = (0.7, 0.85)
DEFAULT_HOT_FRACTION = 0.7
# The source design documents keep memory below 85% and alert on KV-cache usage above it.
KV_ALERT_FRACTION = 0.85
# vLLM runs at most this many sequences at once unless --max-num-seqs says otherwise.
VLLM_DEFAULT_MAX_NUM_SEQS = 256


@dataclass(frozen=True)
class ModelPreset:
    label: str
    # The config.json fields the KV cost model reads, as on the Hugging Face Hub.
    config: Mapping[str, Any]
    # Checkpoint size: parameters x 2 bytes (bf16).
    weights_gib: float

    @property
    def kv_shape(self) -> KvShape:
        return kv_shape_from_config(self.config)


def _bf16_gib(billions_of_parameters: float) -> float:
    return round(billions_of_parameters * 1e9 * 2 / GIB, 2)


MODEL_PRESETS: dict[str, ModelPreset] = {
    "llama-3-8b": ModelPreset(
        "Llama-3-8B",
        {
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 8,
            "torch_dtype": "bfloat16",
        },
        _bf16_gib(8.03),
    ),
    "llama-3-70b": ModelPreset(
        "Llama-3-70B",
        {
            "hidden_size": 8192,
            "num_attention_heads": 64,
            "num_hidden_layers": 80,
            "num_key_value_heads": 8,
            "torch_dtype": "bfloat16",
        },
        _bf16_gib(70.55),
    ),
    "qwen2-7b": ModelPreset(
        "Qwen2-7B",
        {
            "hidden_size": 3584,
            "num_attention_heads": 28,
            "num_hidden_layers": 28,
            "num_key_value_heads": 4,
            "torch_dtype": "bfloat16",
        },
        _bf16_gib(7.62),
    ),
    "mistral-7b": ModelPreset(
        "Mistral-7B",
        {
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 8,
            "torch_dtype": "bfloat16",
        },
        _bf16_gib(7.24),
    ),
}


@dataclass(frozen=True)
class GpuPreset:
    label: str
    memory_gib: float


GPU_PRESETS: dict[str, GpuPreset] = {
    "l4": GpuPreset("NVIDIA L4 (24 GB)", 24.0),
    "a10": GpuPreset("NVIDIA A10 (24 GB)", 24.0),
    "a100-40": GpuPreset("NVIDIA A100 40GB", 40.0),
    "a100-80": GpuPreset("NVIDIA A100 80GB", 80.0),
    "h100-80": GpuPreset("NVIDIA H100 80GB", 80.0),
    "h200": GpuPreset("NVIDIA H200 (141 GB)", 141.0),
}


@dataclass(frozen=True)
class MemoryPlan:
    """One engine's memory on each of its cards, and the requests that fit in its KV space."""

    gpu_memory_bytes: int
    usable_bytes: int  # per card: memory x utilisation
    weights_bytes: int  # per card: the checkpoint split over the engine's cards
    reserve_bytes: int  # per card: CUDA context, activations, framework buffers
    kv_space_bytes: int  # per card, 0 when weights and reserve do not fit
    gpus_per_engine: int
    bytes_per_token: int
    request_kv_bytes: int  # one request's worst case, over the whole engine
    concurrent_requests: int  # per engine
    problem: str | None

    @property
    def fits(self) -> bool:
        return self.problem is None

    @property
    def unused_bytes(self) -> int:
        """What the utilisation fraction leaves to the driver and other processes."""
        return self.gpu_memory_bytes - self.usable_bytes

    @property
    def engine_kv_bytes(self) -> int:
        return self.kv_space_bytes * self.gpus_per_engine

    @property
    def kv_tokens(self) -> int:
        """Tokens of KV cache the engine holds."""
        return self.engine_kv_bytes // self.bytes_per_token

    @property
    def request_kv_units(self) -> float:
        return bytes_to_units_exact(self.request_kv_bytes)

    @property
    def kv_space_units(self) -> int:
        """The engine's KV space in whole units (a capacity: floored)."""
        return bytes_to_units_floor(self.engine_kv_bytes)

    @property
    def footprint_units(self) -> int:
        """Units the engine holds on each card."""
        return bytes_to_units_floor(self.usable_bytes)

    @property
    def gpu_memory_utilization(self) -> float:
        """vLLM's flag for that footprint (at most the utilisation asked for)."""
        if self.footprint_units == 0:
            return 0.0
        return gpu_memory_utilization(
            footprint_units=self.footprint_units, gpu_memory_bytes=self.gpu_memory_bytes
        )

    @property
    def beyond_default_max_num_seqs(self) -> bool:
        """More requests fit than vLLM runs by default: the room needs --max-num-seqs."""
        return self.concurrent_requests > VLLM_DEFAULT_MAX_NUM_SEQS

    @property
    def requests_below_alert(self) -> int:
        """Requests that keep KV-cache usage under the 85% alert line (docs/ARCHITECTURE.md)."""
        if self.request_kv_bytes == 0:
            return 0
        return int(self.engine_kv_bytes * KV_ALERT_FRACTION) // self.request_kv_bytes


def plan_memory(
    *,
    kv_shape: KvShape,
    weights_gib: float,
    gpu_memory_gib: float,
    utilisation: float,
    reserve_gib: float,
    prompt_tokens: int,
    output_tokens: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
    gpus_per_engine: int = 1,
) -> MemoryPlan:
    """How many requests of `prompt_tokens + output_tokens` one engine runs at once.

    With tensor parallelism the weights and each token's KV cache are split over the
    engine's cards, so the engine's KV space is the sum of its cards' KV space.
    """
    if gpu_memory_gib <= 0:
        raise ValueError("a GPU's memory must be positive")
    if not 0 < utilisation <= 1:
        raise ValueError("the utilisation fraction must be in (0, 1]")
    if weights_gib < 0 or reserve_gib < 0:
        raise ValueError("weights and reserve cannot be negative")
    if gpus_per_engine < 1:
        raise ValueError("an engine runs on at least one GPU")
    if prompt_tokens + output_tokens <= 0:
        raise ValueError("a request needs at least one token")

    gpu_memory_bytes = gib_to_bytes(gpu_memory_gib)
    usable_bytes = int(gpu_memory_bytes * utilisation)
    weights_bytes = -(-gib_to_bytes(weights_gib) // gpus_per_engine)
    reserve_bytes = gib_to_bytes(reserve_gib)
    bytes_per_token = kv_shape.bytes_per_token
    request_kv_bytes = kv_cost_bytes(
        bytes_per_token=bytes_per_token,
        prompt_tokens=prompt_tokens,
        max_tokens=output_tokens,
        block_size=block_size,
    )
    kv_space_bytes = max(0, usable_bytes - weights_bytes - reserve_bytes)
    concurrent = kv_space_bytes * gpus_per_engine // request_kv_bytes

    problem = None
    if kv_space_bytes == 0:
        problem = (
            f"Weights ({weights_bytes / GIB:.1f} GiB per card) and the framework reserve "
            f"({reserve_gib:g} GiB) leave no KV space in {usable_bytes / GIB:.1f} GiB usable "
            f"({utilisation:g} of {gpu_memory_gib:g} GiB): use a bigger card, more cards per "
            "engine, or a quantised model."
        )
    elif concurrent == 0:
        problem = (
            f"One request of {prompt_tokens + output_tokens} tokens needs "
            f"{request_kv_bytes / GIB:.2f} GiB of KV cache, more than the engine's "
            f"{kv_space_bytes * gpus_per_engine / GIB:.2f} GiB: shorten requests or add memory."
        )
    return MemoryPlan(
        gpu_memory_bytes=gpu_memory_bytes,
        usable_bytes=usable_bytes,
        weights_bytes=weights_bytes,
        reserve_bytes=reserve_bytes,
        kv_space_bytes=kv_space_bytes,
        gpus_per_engine=gpus_per_engine,
        bytes_per_token=bytes_per_token,
        request_kv_bytes=request_kv_bytes,
        concurrent_requests=concurrent,
        problem=problem,
    )


@dataclass(frozen=True)
class FleetPlan:
    peak_qps: float
    per_card_qps: float
    gpus: int
    hot_gpus: int
    cold_gpus: int

    @property
    def hot_qps(self) -> float:
        """The load the hot pool carries alone; the cold pool takes the rest of the peak."""
        return min(self.peak_qps, self.hot_gpus * self.per_card_qps)


def per_card_qps(
    *, effective_utilisation: float, request_throughput_qps: float, safety_factor: float
) -> float:
    """单卡并发能力 = 有效利用率 x GPU单请求吞吐 x 安全系数."""
    if not 0 < effective_utilisation <= 1:
        raise ValueError("effective utilisation must be in (0, 1]")
    if request_throughput_qps <= 0:
        raise ValueError("per-request throughput must be positive")
    if not 0 < safety_factor <= 1:
        raise ValueError("the safety factor must be in (0, 1]")
    return effective_utilisation * request_throughput_qps * safety_factor


def _round_up_to(count: int, multiple: int) -> int:
    return -(-count // multiple) * multiple


def plan_fleet(
    *,
    peak_qps: float,
    effective_utilisation: float,
    request_throughput_qps: float,
    safety_factor: float,
    hot_fraction: float = DEFAULT_HOT_FRACTION,
    gpus_per_engine: int = 1,
) -> FleetPlan:
    """Cards for the daily peak, and the hot/cold split, in whole engines."""
    if peak_qps <= 0:
        raise ValueError("the peak QPS must be positive")
    if not 0 < hot_fraction <= 1:
        raise ValueError("the hot fraction must be in (0, 1]")
    if gpus_per_engine < 1:
        raise ValueError("an engine runs on at least one GPU")
    card_qps = per_card_qps(
        effective_utilisation=effective_utilisation,
        request_throughput_qps=request_throughput_qps,
        safety_factor=safety_factor,
    )
    # A hair of tolerance so 2000 / 20.000000000000004 is 100 cards, not 101.
    gpus = _round_up_to(math.ceil(peak_qps / card_qps - 1e-9), gpus_per_engine)
    hot = min(gpus, _round_up_to(math.ceil(gpus * hot_fraction - 1e-9), gpus_per_engine))
    return FleetPlan(
        peak_qps=peak_qps, per_card_qps=card_qps, gpus=gpus, hot_gpus=hot, cold_gpus=gpus - hot
    )
