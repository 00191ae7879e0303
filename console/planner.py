"""The capacity planner: how much GPU memory a model's weights, vLLM's reserve and the KV cache
need, and how many engines and GPUs a fleet takes (`capacity.planner`)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.safestring import mark_safe

from capacity.kvcost import DEFAULT_BLOCK_SIZE
from capacity.planner import (
    VLLM_DEFAULT_MAX_NUM_SEQS,
    FleetPlan,
    MemoryPlan,
    plan_fleet,
    plan_memory,
)
from capacity.units import GIB
from console.charts import Segment, stacked_bar
from console.planner_forms import PlannerForm
from staff.access import console_permission
from staff.roles import Perm

COLOURS = {"weights": "#5b6b8c", "reserve": "#c98a2b", "kv": "#2f9e6e", "unused": "#c9ced6"}


@console_permission(Perm.VIEW)
def planner(request: HttpRequest) -> HttpResponse:
    form = PlannerForm(request.GET)
    memory: MemoryPlan | None = None
    fleet: FleetPlan | None = None
    if form.is_valid():
        data = form.cleaned_data
        try:
            memory = plan_memory(
                kv_shape=form.kv_shape,
                weights_gib=data["weights_gib"],
                gpu_memory_gib=data["gpu_memory_gib"],
                utilisation=data["utilisation"],
                reserve_gib=data["reserve_gib"],
                prompt_tokens=data["prompt_tokens"],
                output_tokens=data["output_tokens"],
                gpus_per_engine=data["gpus_per_engine"],
            )
            fleet = plan_fleet(
                peak_qps=data["peak_qps"],
                effective_utilisation=data["effective_utilisation"],
                request_throughput_qps=data["request_throughput_qps"],
                safety_factor=data["safety_factor"],
                hot_fraction=data["hot_fraction"],
                gpus_per_engine=data["gpus_per_engine"],
            )
        except ValueError as exc:
            form.add_error(None, str(exc))
    context = {
        "section": "planner",
        "form": form,
        "memory": memory,
        "fleet": fleet,
        "memory_bar": mark_safe(_memory_bar(memory)) if memory else "",
        "memory_facts": _memory_facts(memory) if memory else [],
        "max_num_seqs_default": VLLM_DEFAULT_MAX_NUM_SEQS,
    }
    return render(request, "console/planner.html", context)


def _size(nbytes: int) -> str:
    """Binary units, named as such: '128 KiB', '90.0 MiB', '55.0 GiB'."""
    for unit, scale in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{nbytes} B"


def _memory_facts(memory: MemoryPlan) -> list[tuple[str, str]]:
    cards = f" over {memory.gpus_per_engine} cards" if memory.gpus_per_engine > 1 else ""
    return [
        ("KV per token", _size(memory.bytes_per_token)),
        (
            "KV per request",
            f"{_size(memory.request_kv_bytes)} = {memory.request_kv_units:.2f} units "
            f"(whole blocks of {DEFAULT_BLOCK_SIZE} tokens)",
        ),
        (
            "KV space",
            f"{_size(memory.engine_kv_bytes)} = {memory.kv_space_units} units, "
            f"{memory.kv_tokens:,} tokens{cards}",
        ),
        (
            "Engine footprint",
            f"{memory.footprint_units} units per card "
            f"(--gpu-memory-utilization {memory.gpu_memory_utilization:g})",
        ),
    ]


def _memory_bar(memory: MemoryPlan) -> str:

    # Overfull cards draw weights and reserve past the usable line, so clip to the card.
    segments = [
        Segment("Weights", memory.weights_bytes, COLOURS["weights"], _size(memory.weights_bytes)),
        Segment(
            "Framework reserve",
            memory.reserve_bytes,
            COLOURS["reserve"],
            _size(memory.reserve_bytes),
        ),
        Segment("KV cache", memory.kv_space_bytes, COLOURS["kv"], _size(memory.kv_space_bytes)),
        Segment(
            "Left unused (utilisation)",
            memory.unused_bytes,
            COLOURS["unused"],
            _size(memory.unused_bytes),
        ),
    ]
    return stacked_bar(
        segments,
        total=memory.gpu_memory_bytes,
        title=f"Memory of one card ({_size(memory.gpu_memory_bytes)})",
    )
