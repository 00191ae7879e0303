"""The KV-cache cost model: how many bytes of KV cache a model needs per token, and what a
request reserves.

kv_bytes_per_token = 2 (K and V) x layers x kv_heads x head_dim x dtype bytes, read from the
model folder's `config.json`. A request reserves its worst case, prompt + max output tokens,
rounded up to whole KV blocks because vLLM allocates the cache in blocks of `block_size` tokens.

The fair scheduler counts reservations in bytes (exact integers, so reserve and release
always cancel out in Redis); reports show the same amounts as fractions of 256 MiB units.
"""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capacity.units import UNIT_BYTES, bytes_to_units_exact

DEFAULT_BLOCK_SIZE = 16

# Bytes per element of the KV cache. fp32 counts 4 bytes even though vLLM's dtype "auto"
# serves an fp32 checkpoint in 16 bits: over-reserving queues a request, under-reserving
# runs the engine out of cache.
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "float8": 1,
    "fp8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
# HF configs without a dtype were saved in fp32 by default.
DEFAULT_DTYPE = "float32"


class ModelConfigError(ValueError):
    """A model's config.json lacks what the KV cost model needs."""


@dataclass(frozen=True)
class KvShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


def dtype_bytes(dtype: str) -> int:
    name = dtype.removeprefix("torch.").lower()
    try:
        return DTYPE_BYTES[name]
    except KeyError:
        raise ModelConfigError(f"unknown dtype {dtype!r}; known: {sorted(DTYPE_BYTES)}") from None


def _int_field(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ModelConfigError(f"config.json needs a positive integer {key!r}, got {value!r}")
    return value


def kv_shape_from_config(config: Mapping[str, Any], *, kv_dtype: str | None = None) -> KvShape:
    """The KV shape of a model from its parsed config.json.

    `kv_dtype` overrides the checkpoint's dtype when the engine stores its cache otherwise
    (vLLM's `--kv-cache-dtype fp8`, `--dtype half`).
    """
    # Multimodal checkpoints (Llava, Qwen2-VL, ...) keep the language model's shape here.
    text_config = config.get("text_config")
    if "num_hidden_layers" not in config and isinstance(text_config, Mapping):
        return kv_shape_from_config(
            {**text_config, "torch_dtype": config.get("torch_dtype")}, kv_dtype=kv_dtype
        )
    num_layers = _int_field(config, "num_hidden_layers")
    num_heads = _int_field(config, "num_attention_heads")
    # Absent means multi-head attention: every query head has its own K/V head.
    num_kv_heads = (
        _int_field(config, "num_key_value_heads")
        if config.get("num_key_value_heads") is not None
        else num_heads
    )
    if config.get("head_dim") is not None:
        head_dim = _int_field(config, "head_dim")
    else:
        hidden = _int_field(config, "hidden_size")
        if hidden % num_heads:
            raise ModelConfigError(f"hidden_size {hidden} is not a multiple of {num_heads} heads")
        head_dim = hidden // num_heads
    # Newer transformers write `dtype`, older ones `torch_dtype`.
    dtype = kv_dtype or config.get("dtype") or config.get("torch_dtype") or DEFAULT_DTYPE
    if not isinstance(dtype, str):
        raise ModelConfigError(f"dtype must be a string, got {dtype!r}")
    return KvShape(num_layers, num_kv_heads, head_dim, dtype_bytes(dtype))


def read_model_config(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    try:
        with path.open(encoding="utf-8") as handle:
            config = json.load(handle)
    except FileNotFoundError:
        raise ModelConfigError(f"{path} does not exist: is {model_dir} a model folder?") from None
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ModelConfigError(f"{path} must hold a JSON object")
    return config


def kv_bytes_per_token(model_dir: str | Path, *, kv_dtype: str | None = None) -> int:
    """KV-cache bytes one token of this model holds, from `model_dir/config.json`."""
    return kv_shape_from_config(read_model_config(model_dir), kv_dtype=kv_dtype).bytes_per_token


def tokens_to_blocks(tokens: int, *, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    if tokens < 0:
        raise ValueError("a token count cannot be negative")
    if block_size <= 0:
        raise ValueError("a block size must be positive")
    return -(-tokens // block_size)


def kv_cost_bytes(
    *,
    bytes_per_token: int,
    prompt_tokens: int,
    max_tokens: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> int:
    """Bytes of KV cache a request reserves: its worst case, in whole blocks."""
    if bytes_per_token <= 0:
        raise ValueError("bytes per token must be positive")
    if prompt_tokens < 0 or max_tokens < 0:
        raise ValueError("token counts cannot be negative")
    blocks = tokens_to_blocks(prompt_tokens + max_tokens, block_size=block_size)
    return blocks * block_size * bytes_per_token


def kv_cost_bytes_of(
    *,
    bytes_per_token: int,
    prompt_tokens: Sequence[int],
    max_tokens: int,
    n: int = 1,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> int:
    """Bytes of KV cache a request of several sequences reserves: each prompt's worst case,
    for each of its n samples. The engine may share a prompt's blocks between its samples
    (prefix caching), but need not: the reservation does not count on it."""
    if n < 1:
        raise ValueError("a request runs at least one sample of each prompt")
    return n * sum(
        kv_cost_bytes(
            bytes_per_token=bytes_per_token,
            prompt_tokens=prompt,
            max_tokens=max_tokens,
            block_size=block_size,
        )
        for prompt in prompt_tokens
    )


@dataclass(frozen=True)
class KvCost:
    """What a request of several sequences may reserve of an engine's KV: its worst case
    (`kv_cost_bytes_of`), and what a prediction of it is made of: its prompts with a block of
    output per sequence (`floor_bytes`), and the bytes each token it generates adds
    (`token_bytes`, per sequence). fairqueue/lua/lib.lua `job_cost` reserves
    min(worst, floor + sequences x predicted tokens x token_bytes)."""

    worst_bytes: int
    floor_bytes: int
    token_bytes: int

    def enqueue_fields(self) -> dict[str, int]:
        """As `fairqueue.queue.FairQueue.enqueue` takes them."""
        return {
            "kv_bytes": self.worst_bytes,
            "kv_floor": self.floor_bytes,
            "kv_token": self.token_bytes,
        }


def kv_cost_of(
    *,
    bytes_per_token: int,
    prompt_tokens: Sequence[int],
    max_tokens: int,
    n: int = 1,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> KvCost:
    worst = kv_cost_bytes_of(
        bytes_per_token=bytes_per_token, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
        n=n, block_size=block_size,
    )  # fmt: skip
    floor = kv_cost_bytes_of(
        bytes_per_token=bytes_per_token, prompt_tokens=prompt_tokens,
        max_tokens=min(max_tokens, block_size), n=n, block_size=block_size,
    )  # fmt: skip
    return KvCost(worst_bytes=worst, floor_bytes=floor, token_bytes=bytes_per_token)


def kv_cost_units(
    *,
    bytes_per_token: int,
    prompt_tokens: int,
    max_tokens: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> float:
    """The same reservation as a fraction of units, for reports and the console."""
    return bytes_to_units_exact(
        kv_cost_bytes(
            bytes_per_token=bytes_per_token,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            block_size=block_size,
        )
    )


def tokens_per_unit(bytes_per_token: int) -> int:
    """Whole tokens of KV cache one unit holds (Llama-3-8B: 2,048)."""
    if bytes_per_token <= 0:
        raise ValueError("bytes per token must be positive")
    return UNIT_BYTES // bytes_per_token


def kv_capacity_bytes(*, num_blocks: int, block_size: int, bytes_per_token: int) -> int:
    """Bytes of KV cache an engine holds, from the blocks it reports after start."""
    return num_blocks * block_size * bytes_per_token
