"""An adapter's units and an engine's adapter slots, from files' sizes and config.json."""

import pytest

from capacity.adapters import adapter_units, engine_adapter_units, lora_slot_bytes
from capacity.units import UNIT_BYTES

# The demo model's config.json (scripts/make_tiny_model.py), and a Llama-3-8B-like one.
TINY = {
    "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2,
    "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 256, "dtype": "bfloat16",
}  # fmt: skip
LLAMA_8B = {
    "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 14336, "torch_dtype": "bfloat16",
}  # fmt: skip


def test_an_adapter_holds_its_bytes_in_whole_units_and_at_least_one() -> None:
    assert adapter_units(0) == 1
    assert adapter_units(1) == 1
    assert adapter_units(UNIT_BYTES) == 1
    assert adapter_units(UNIT_BYTES + 1) == 2
    with pytest.raises(ValueError, match="negative"):
        adapter_units(-1)


def test_a_slot_holds_a_and_b_of_every_projection_at_the_rank() -> None:
    # Per layer: q, k, v, o of 128 -> 128, gate and up 128 -> 256, down 256 -> 128;
    # r x (in + out) each, two bytes a parameter.
    per_layer = 4 * (128 + 128) + 3 * (128 + 256)
    assert lora_slot_bytes(TINY, 8) == 8 * per_layer * 2 * 2
    # Llama-3-8B at rank 16: about 84 MB a slot (q 4096->4096, k, v 4096->1024, ...).
    big = lora_slot_bytes(LLAMA_8B, 16)
    assert big == 16 * (2 * 8192 + 2 * 5120 + 3 * 18432) * 32 * 2
    assert lora_slot_bytes(LLAMA_8B, 64) == 4 * big


def test_an_engines_slots_are_whole_units_together() -> None:
    assert engine_adapter_units(TINY, max_loras=0, max_lora_rank=16) == 0
    assert engine_adapter_units(TINY, max_loras=3, max_lora_rank=16) == 1
    # Rank 64 on an 8B model: 3 slots of 1.25 units each, 3.75 together.
    assert engine_adapter_units(LLAMA_8B, max_loras=3, max_lora_rank=64) == 4
    # Rank 512 on an 8B model: 2.5 GiB a slot.
    assert engine_adapter_units(LLAMA_8B, max_loras=2, max_lora_rank=512) == 2 * 10
