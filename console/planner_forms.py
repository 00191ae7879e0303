"""The capacity planner's form. The arithmetic lives in capacity.planner."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from django import forms

from capacity.kvcost import KvShape, kv_shape_from_config
from capacity.planner import GPU_PRESETS, MODEL_PRESETS, SAFETY_FACTOR_RANGE

CUSTOM = "custom"
MODEL_FIELDS = ("num_layers", "num_kv_heads", "head_dim", "dtype_bytes", "weights_gib")

# A fresh page: the worked example of the source design documents (600 prompt + 120 output
# tokens; docs/ARCHITECTURE.md) on a common card.
DEFAULTS: dict[str, str] = {
    "preset": "llama-3-8b",
    "gpu": "a100-80",
    "utilisation": "0.9",
    "reserve_gib": "2",
    "gpus_per_engine": "1",
    "prompt_tokens": "600",
    "output_tokens": "120",
    "peak_qps": "2000",
    "request_throughput_qps": "40",
    "effective_utilisation": "0.7",
    "safety_factor": "0.8",
    "hot_fraction": "0.7",
}


def _preset_values(key: str) -> dict[str, str]:
    preset = MODEL_PRESETS[key]
    shape = preset.kv_shape
    return {
        "num_layers": str(shape.num_layers),
        "num_kv_heads": str(shape.num_kv_heads),
        "head_dim": str(shape.head_dim),
        "dtype_bytes": str(shape.dtype_bytes),
        "weights_gib": f"{preset.weights_gib:g}",
    }


def _same_number(a: str | None, b: str) -> bool:
    try:
        return a is not None and float(a) == float(b)
    except ValueError:
        return False


class PlannerForm(forms.Form):
    """Model and GPU presets and a pasted config.json fill in the numeric fields.

    The numbers are what is computed; a preset or config.json only writes them (so an
    operator can start from Llama-3-8B and change one field). Editing a filled-in number
    turns the preset back into "custom".
    """

    preset = forms.ChoiceField(
        label="Model preset",
        choices=[(CUSTOM, "Custom (fields below)")]
        + [(key, p.label) for key, p in MODEL_PRESETS.items()],
    )
    applied_preset = forms.CharField(required=False, widget=forms.HiddenInput)
    config_json = forms.CharField(
        label="or paste config.json",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": '{"num_hidden_layers": 32, ...}'}),
        help_text="Fills in layers, KV heads, head dim and dtype; weights stay yours to give.",
    )
    num_layers = forms.IntegerField(label="Layers", min_value=1)
    num_kv_heads = forms.IntegerField(label="KV heads", min_value=1)
    head_dim = forms.IntegerField(label="Head dim", min_value=1)
    dtype_bytes = forms.TypedChoiceField(
        label="KV dtype",
        coerce=int,
        choices=[("2", "fp16 / bf16 (2 bytes)"), ("1", "fp8 (1 byte)"), ("4", "fp32 (4 bytes)")],
    )
    weights_gib = forms.FloatField(label="Weights (GiB)", min_value=0)

    gpu = forms.ChoiceField(
        label="GPU preset",
        choices=[(CUSTOM, "Custom")] + [(key, g.label) for key, g in GPU_PRESETS.items()],
    )
    applied_gpu = forms.CharField(required=False, widget=forms.HiddenInput)
    gpu_memory_gib = forms.FloatField(label="GPU memory (GiB)", min_value=1)
    utilisation = forms.FloatField(
        label="Memory utilisation",
        min_value=0.05,
        max_value=1,
        help_text="vLLM's --gpu-memory-utilization; the design documents use 0.75-0.9.",
    )
    reserve_gib = forms.FloatField(
        label="Framework reserve (GiB)",
        min_value=0,
        help_text="CUDA context, activations, framework buffers.",
    )
    gpus_per_engine = forms.IntegerField(
        label="GPUs per engine", min_value=1, max_value=16, help_text="Tensor parallel size."
    )
    prompt_tokens = forms.IntegerField(label="Prompt tokens", min_value=0)
    output_tokens = forms.IntegerField(label="Max output tokens", min_value=1)

    peak_qps = forms.FloatField(label="Daily peak (req/s)", min_value=0.001)
    request_throughput_qps = forms.FloatField(
        label="Per-request throughput of a card (req/s)",
        min_value=0.001,
        help_text="Requests a card completes per second at full utilisation.",
    )
    effective_utilisation = forms.FloatField(
        label="Effective utilisation", min_value=0.01, max_value=1
    )
    safety_factor = forms.FloatField(
        label="Safety factor",
        min_value=SAFETY_FACTOR_RANGE[0],
        max_value=SAFETY_FACTOR_RANGE[1],
        help_text=(
            f"{SAFETY_FACTOR_RANGE[0]}-{SAFETY_FACTOR_RANGE[1]}, as the design documents advise."
        ),
    )
    hot_fraction = forms.FloatField(label="Hot pool share of peak", min_value=0.05, max_value=1)

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        values: dict[str, Any] = {**DEFAULTS, **({k: data.get(k) for k in data} if data else {})}
        self.notes: list[str] = []
        self._config_error: str | None = None
        self._fill_in(values)
        super().__init__(values)

    def _fill_in(self, values: dict[str, Any]) -> None:
        config_text = (values.get("config_json") or "").strip()
        if config_text:
            try:
                shape = _shape_from_text(config_text)
            except ValueError as exc:
                self._config_error = str(exc)
            else:
                values.update(
                    num_layers=str(shape.num_layers),
                    num_kv_heads=str(shape.num_kv_heads),
                    head_dim=str(shape.head_dim),
                    dtype_bytes=str(shape.dtype_bytes),
                    config_json="",
                    preset=CUSTOM,
                    applied_preset=CUSTOM,
                )
                self.notes.append(
                    f"Filled in from config.json: {shape.num_layers} layers, "
                    f"{shape.num_kv_heads} KV heads, head dim {shape.head_dim}, "
                    f"{shape.dtype_bytes}-byte KV."
                )
        else:
            _apply_preset(values, "preset", "applied_preset", MODEL_PRESETS, _preset_values)
        _apply_preset(
            values,
            "gpu",
            "applied_gpu",
            GPU_PRESETS,
            lambda key: {"gpu_memory_gib": f"{GPU_PRESETS[key].memory_gib:g}"},
        )

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean()
        if self._config_error:
            self.add_error("config_json", self._config_error)
        return cleaned

    @property
    def kv_shape(self) -> KvShape:
        data = self.cleaned_data
        return KvShape(
            num_layers=data["num_layers"],
            num_kv_heads=data["num_kv_heads"],
            head_dim=data["head_dim"],
            dtype_bytes=data["dtype_bytes"],
        )


def _shape_from_text(text: str) -> KvShape:
    config = json.loads(text)
    if not isinstance(config, dict):
        raise ValueError("config.json must hold a JSON object")
    return kv_shape_from_config(config)


def _apply_preset(
    values: dict[str, Any],
    field: str,
    applied_field: str,
    presets: Mapping[str, object],
    preset_values: Callable[[str], dict[str, str]],
) -> None:
    """Write a newly chosen preset's numbers; a changed number makes the choice "custom"."""
    chosen = values.get(field)
    if not isinstance(chosen, str) or chosen not in presets:
        values[applied_field] = CUSTOM
        return
    wanted = preset_values(chosen)
    if values.get(applied_field) != chosen:
        values.update(wanted)
        values[applied_field] = chosen
    elif not all(_same_number(values.get(k), v) for k, v in wanted.items()):
        values[field] = values[applied_field] = CUSTOM
