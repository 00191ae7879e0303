"""The KV cost model against real models' config.json files (no database)."""

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capacity.kvcost import (
    ModelConfigError,
    kv_bytes_per_token,
    kv_cost_bytes,
    kv_cost_bytes_of,
    kv_cost_units,
    kv_shape_from_config,
    tokens_per_unit,
)
from capacity.units import UNIT_BYTES

# The fields that matter, copied from each model's config.json on the Hugging Face Hub.
LLAMA_3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
}
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"],
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
}
QWEN2_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 3584,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "torch_dtype": "bfloat16",
}
# Gemma-2 sets head_dim (256) unlike hidden/heads (224): the explicit one wins.
GEMMA_2_9B = {
    "architectures": ["Gemma2ForCausalLM"],
    "hidden_size": 3584,
    "head_dim": 256,
    "num_attention_heads": 16,
    "num_hidden_layers": 42,
    "num_key_value_heads": 8,
    "torch_dtype": "float32",
}
# OPT has no num_key_value_heads: multi-head attention.
OPT_125M = {
    "architectures": ["OPTForCausalLM"],
    "hidden_size": 768,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "torch_dtype": "float16",
}
# Newer transformers write `dtype` instead of `torch_dtype`.
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "hidden_size": 4096,
    "head_dim": 128,
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "dtype": "bfloat16",
}


def write_model(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (LLAMA_3_8B, 128 * 1024),  # 2 x 32 x 8 x 128 x 2
        (MISTRAL_7B, 128 * 1024),
        (QWEN2_7B, 2 * 28 * 4 * 128 * 2),
        (GEMMA_2_9B, 2 * 42 * 8 * 256 * 4),
        (OPT_125M, 2 * 12 * 12 * 64 * 2),
        (QWEN3_8B, 2 * 36 * 8 * 128 * 2),
    ],
    ids=["llama-3-8b", "mistral-7b", "qwen2-7b", "gemma-2-9b-fp32", "opt-125m-mha", "qwen3-dtype"],
)
def test_it_computes_kv_bytes_per_token_of_known_models(
    tmp_path: Path, config: dict, expected: int
) -> None:
    assert kv_bytes_per_token(write_model(tmp_path, config)) == expected


def test_llama_3_8b_holds_2048_tokens_per_unit(tmp_path: Path) -> None:
    assert tokens_per_unit(kv_bytes_per_token(write_model(tmp_path, LLAMA_3_8B))) == 2048


def test_an_engine_kv_dtype_overrides_the_checkpoint() -> None:
    assert kv_shape_from_config(LLAMA_3_8B, kv_dtype="fp8").bytes_per_token == 64 * 1024


def test_it_reads_the_language_model_of_a_multimodal_config() -> None:
    config = {
        "text_config": {k: v for k, v in LLAMA_3_8B.items() if k != "torch_dtype"},
        "torch_dtype": "bfloat16",
    }
    assert kv_shape_from_config(config).bytes_per_token == 128 * 1024


def test_a_request_reserves_whole_blocks() -> None:
    # 100 + 200 = 300 tokens -> 19 blocks of 16 = 304 tokens.
    cost = kv_cost_bytes(bytes_per_token=128 * 1024, prompt_tokens=100, max_tokens=200)
    assert cost == 304 * 128 * 1024
    assert kv_cost_units(bytes_per_token=128 * 1024, prompt_tokens=100, max_tokens=200) == (
        304 / 2048
    )


def test_a_full_unit_of_llama_3_tokens_costs_exactly_one_unit() -> None:
    assert kv_cost_bytes(bytes_per_token=128 * 1024, prompt_tokens=2000, max_tokens=48) == (
        UNIT_BYTES
    )


@given(
    bytes_per_token=st.integers(min_value=1, max_value=2**20),
    prompt=st.integers(min_value=0, max_value=200_000),
    output=st.integers(min_value=0, max_value=200_000),
    block_size=st.sampled_from([1, 8, 16, 32, 128]),
)
def test_a_cost_covers_the_tokens_and_wastes_less_than_one_block(
    bytes_per_token: int, prompt: int, output: int, block_size: int
) -> None:
    cost = kv_cost_bytes(
        bytes_per_token=bytes_per_token,
        prompt_tokens=prompt,
        max_tokens=output,
        block_size=block_size,
    )
    exact = (prompt + output) * bytes_per_token
    assert cost >= exact
    assert cost - exact < block_size * bytes_per_token
    assert cost % (block_size * bytes_per_token) == 0


def test_a_missing_config_says_which_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match=r"config\.json does not exist"):
        kv_bytes_per_token(tmp_path)


def test_an_unknown_dtype_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="unknown dtype 'int3'"):
        kv_bytes_per_token(write_model(tmp_path, {**LLAMA_3_8B, "torch_dtype": "int3"}))


def test_a_config_without_layers_is_refused() -> None:
    with pytest.raises(ModelConfigError, match="num_hidden_layers"):
        kv_shape_from_config({"num_attention_heads": 2, "hidden_size": 128})


def test_a_request_of_several_sequences_reserves_each_prompt_for_each_sample() -> None:
    one = kv_cost_bytes(bytes_per_token=100, prompt_tokens=10, max_tokens=7, block_size=16)
    two = kv_cost_bytes(bytes_per_token=100, prompt_tokens=30, max_tokens=7, block_size=16)
    assert (one, two) == (3200, 4800)  # whole blocks each: 17 tokens -> 2 blocks, 37 -> 3
    got = kv_cost_bytes_of(
        bytes_per_token=100, prompt_tokens=[10, 30], max_tokens=7, n=3, block_size=16
    )
    assert got == 3 * (one + two)
    with pytest.raises(ValueError, match="at least one sample"):
        kv_cost_bytes_of(bytes_per_token=100, prompt_tokens=[10], max_tokens=7, n=0)
