"""What LoRA adapters hold, in 256 MiB units: a registered adapter (its files) and an
engine's adapter slots (vLLM's --max-loras, each room for an adapter of --max-lora-rank on
every linear layer of the model). Pure: tested without Django or an engine."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from capacity.kvcost import DEFAULT_DTYPE, _int_field, dtype_bytes
from capacity.units import bytes_to_units_ceil


def adapter_units(size_bytes: int) -> int:
    """A registered adapter's units: its files' bytes, rounded up, at least one unit (an
    engine loads the whole checkpoint)."""
    if size_bytes < 0:
        raise ValueError("a size cannot be negative")
    return max(1, bytes_to_units_ceil(size_bytes))


def lora_slot_bytes(config: Mapping[str, Any], rank: int) -> int:
    """Bytes one adapter slot of rank `rank` holds on an engine of the model whose
    config.json is `config`: A (rank x in) and B (out x rank) for each of a decoder layer's
    attention (q, k, v, o) and MLP (gate, up, down) projections, in the model's dtype. That
    is what vLLM sets aside per slot on a GPU; an adapter of fewer modules or a lower rank
    holds less."""
    if rank < 1:
        raise ValueError("a rank must be positive")
    text_config = config.get("text_config")
    if "num_hidden_layers" not in config and isinstance(text_config, Mapping):
        return lora_slot_bytes({**text_config, "dtype": config.get("dtype")}, rank)
    layers = _int_field(config, "num_hidden_layers")
    hidden = _int_field(config, "hidden_size")
    heads = _int_field(config, "num_attention_heads")
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    intermediate = int(config.get("intermediate_size") or 4 * hidden)
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    shapes = (  # (in, out) of each projection
        (hidden, q_out), (hidden, kv_out), (hidden, kv_out), (q_out, hidden),
        (hidden, intermediate), (hidden, intermediate), (intermediate, hidden),
    )  # fmt: skip
    dtype = config.get("dtype") or config.get("torch_dtype") or DEFAULT_DTYPE
    params = sum(rank * (n_in + n_out) for n_in, n_out in shapes) * layers
    return params * dtype_bytes(str(dtype))


def engine_adapter_units(config: Mapping[str, Any], *, max_loras: int, max_lora_rank: int) -> int:
    """Units an engine's adapter slots hold of its footprint: `max_loras` slots of
    `max_lora_rank`, together rounded up to whole units (0 when the engine serves no
    adapter)."""
    if max_loras <= 0:
        return 0
    return adapter_units(max_loras * lora_slot_bytes(config, max_lora_rank))
