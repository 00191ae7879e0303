"""The capacity planner page: presets, config.json, validation and the numbers shown."""

import json
import re

from django.test import Client


def _number(page: str, element_id: str) -> int:
    found = re.search(rf'id="{element_id}">(\d+)<', page)
    assert found, f"no #{element_id} in the page"
    return int(found.group(1))


def _value(page: str, field: str) -> str:
    found = re.search(rf'name="{field}" value="([^"]*)"', page)
    assert found, f"no value for {field}"
    return found.group(1)


def _selected(page: str, field: str) -> str:
    select = page[page.index(f'name="{field}"') :]
    found = re.search(r'<option value="([^"]+)" selected>', select)
    assert found
    return found.group(1)


def test_a_fresh_page_plans_the_seeds_example_request(console: Client):
    response = console.get("/console/planner/")

    page = response.content.decode()
    assert response.status_code == 200
    assert _value(page, "num_layers") == "32"  # Llama-3-8B filled in
    assert _selected(page, "preset") == "llama-3-8b"
    assert _number(page, "concurrent") > 500
    assert _number(page, "gpus") == _number(page, "hot-gpus") + _number(page, "cold-gpus")
    assert "<svg" in page
    assert "Weights: 15.0 GiB" in page
    # More room than vLLM runs by default (256 sequences): the page says which flag to set.
    assert f"--max-num-seqs {_number(page, 'concurrent')}" in page


def test_choosing_a_preset_fills_in_its_numbers(console: Client):
    page = console.get(
        "/console/planner/",
        {"preset": "qwen2-7b", "applied_preset": "llama-3-8b", "num_layers": "32"},
    ).content.decode()

    assert _value(page, "num_layers") == "28"
    assert _value(page, "num_kv_heads") == "4"
    assert _value(page, "applied_preset") == "qwen2-7b"


def test_changing_a_filled_in_number_makes_the_model_custom(console: Client):
    first = console.get("/console/planner/").content.decode()
    fields = dict(re.findall(r'name="(\w+)" value="([^"]*)"', first))
    fields.update(preset="llama-3-8b", gpu="a100-80", dtype_bytes="2", num_layers="40")

    page = console.get("/console/planner/", fields).content.decode()

    assert _value(page, "num_layers") == "40"
    assert _selected(page, "preset") == "custom"


def test_a_pasted_config_json_fills_in_the_shape(console: Client):
    config = {
        "hidden_size": 3584,
        "head_dim": 256,
        "num_attention_heads": 16,
        "num_hidden_layers": 42,
        "num_key_value_heads": 8,
        "torch_dtype": "float32",
    }

    page = console.get(
        "/console/planner/", {"config_json": json.dumps(config), "weights_gib": "34"}
    ).content.decode()

    assert _value(page, "num_layers") == "42"
    assert _value(page, "head_dim") == "256"
    assert _selected(page, "dtype_bytes") == "4"
    assert _value(page, "weights_gib") == "34"
    assert "Filled in from config.json" in page


def test_a_broken_config_json_is_shown_next_to_its_field(console: Client):
    page = console.get(
        "/console/planner/", {"config_json": '{"num_hidden_layers": 0}'}
    ).content.decode()

    block = next(b for b in page.split('<div class="field') if 'name="config_json"' in b)
    assert block.startswith(" has-error")
    assert "num_hidden_layers" in block
    assert 'id="concurrent"' not in page


def test_a_safety_factor_outside_the_seeds_range_is_refused(console: Client):
    page = console.get("/console/planner/", {"safety_factor": "0.95"}).content.decode()

    block = next(b for b in page.split('<div class="field') if 'name="safety_factor"' in b)
    assert "less than or equal to 0.85" in block
    assert 'id="gpus"' not in page


def test_a_model_too_big_for_the_card_says_why(console: Client):
    page = console.get(
        "/console/planner/", {"preset": "llama-3-70b", "gpu": "a100-80"}
    ).content.decode()

    assert _number(page, "concurrent") == 0
    assert "leave no KV space" in page


def test_two_cards_per_engine_fit_the_70b_model(console: Client):
    page = console.get(
        "/console/planner/", {"preset": "llama-3-70b", "gpu": "a100-80", "gpus_per_engine": "2"}
    ).content.decode()

    assert _number(page, "concurrent") > 0
    assert _number(page, "gpus") % 2 == 0
