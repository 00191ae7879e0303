"""What the offline gate reads on a real NVIDIA GPU, under three workloads (issue 31).

For a machine with an NVIDIA GPU; CI does not run it. Needs PyTorch with CUDA and
nvidia-ml-py only (no vLLM, no Django, no services):

    python scripts/gpu_check_offline_gate.py [--seconds 4] [--dim 8192] [--seats 256]

Each workload runs on the GPU in a thread while the main thread reads NVML:

- `decode-1`: one sequence decoding: a batch-1 GEMV through `--layers` weight matrices,
  captured in a CUDA graph and replayed (as vLLM decodes);
- `decode-256`: 256 sequences decoding: the same with a batch of 256 (a GEMM);
- `gemm`: a large square GEMM, as a prefill or a training step keeps the tensor cores busy.

For each it prints what the gate reads (docs/ARCHITECTURE.md, The offline gate): the seat
occupancy the workload stands for (its sequences / `--seats`), GPM tensor activity (the load
signal of a GPU; SM activity beside it), the samplers' load and the verdict against
`--threshold`, and NVML's `utilization.gpu`, which is exported but not gated on. The check
passes when one decoding sequence reads as light load and 256 as heavy. KV usage is
vLLM's and is not measured here. Exit status: 0 pass, 1 fail, 2 no GPU, GPM or PyTorch.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

try:
    import pynvml

    # Both modules are free of Django: the platform's own GPM read and load rule are measured.
    from scheduler.gpu_inventory import gpm_activity, nvml_session
    from telemetry.smoothing import engine_load
except ImportError as missing:  # run with an interpreter that has torch but not nvidia-ml-py
    print(f"{missing}: this check needs nvidia-ml-py (and PyTorch with CUDA)", file=sys.stderr)
    sys.exit(2)


@dataclass(frozen=True)
class Reading:
    workload: str
    utilization_gpu: float
    sm_activity: float | None
    tensor_activity: float | None
    steps_per_s: float


def _graphed(torch: Any, step: Callable[[], Any]) -> Callable[[], None]:
    """`step` captured once in a CUDA graph; the returned call replays it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm up the kernels' choice before capture
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def decode(torch: Any, batch: int, dim: int, layers: int) -> Callable[[], None]:
    """A decode step of `batch` sequences: their activations through `layers` weights, each
    large enough that the step reads them from memory, as a model's decode does."""
    weights = [torch.randn(dim, dim, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
    x = torch.randn(batch, dim, device="cuda", dtype=torch.bfloat16)

    def step() -> Any:
        h = x
        for w in weights:
            h = torch.nn.functional.linear(h, w)
        return h

    return _graphed(torch, step)


def gemm(torch: Any, dim: int) -> Callable[[], None]:
    a = torch.randn(dim, dim, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(dim, dim, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(dim, dim, device="cuda", dtype=torch.bfloat16)

    def step() -> None:
        torch.matmul(a, b, out=out)

    return step


def measure(torch: Any, name: str, run: Callable[[], None], seconds: float) -> Reading:
    """Runs `run` in a loop in a thread; reads utilization.gpu and GPM over `seconds`."""
    stop, steps = threading.Event(), [0]

    def loop() -> None:
        while not stop.is_set():
            for _ in range(20):
                run()
            torch.cuda.synchronize()
            steps[0] += 20

    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    time.sleep(1.0)  # past the start, into the steady state
    utilization, sm, tensor = [], [], []
    with nvml_session():
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        started, first_steps = time.monotonic(), steps[0]
        deadline = started + seconds
        while time.monotonic() < deadline:
            (activity,) = gpm_activity([handle], 0.5)
            utilization.append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)
            if activity is not None:
                sm.append(activity.sm_activity)
                tensor.append(activity.tensor_activity)
        rate = (steps[0] - first_steps) / (time.monotonic() - started)
    stop.set()
    worker.join()

    def mean(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.fmean(known) if known else None

    return Reading(name, statistics.fmean(utilization), mean(sm), mean(tensor), rate)


def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="What the offline gate reads on a GPU.")
    parser.add_argument("--seconds", type=float, default=4.0, help="reading per workload")
    parser.add_argument("--dim", type=int, default=8192, help="hidden size of the weights")
    parser.add_argument("--layers", type=int, default=8, help="weights a decode step reads")
    parser.add_argument("--gemm-dim", type=int, default=8192, help="the large GEMM's size")
    parser.add_argument("--seats", type=int, default=256, help="the engine's max_num_seqs")
    parser.add_argument("--threshold", type=float, default=0.4, help="offline_load_threshold")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("no PyTorch here: install torch with CUDA to run this check", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("no CUDA GPU here: this check needs an NVIDIA GPU", file=sys.stderr)
        return 2
    with nvml_session():
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        name = pynvml.nvmlDeviceGetName(handle)
        driver = pynvml.nvmlSystemGetDriverVersion()
        (probe,) = gpm_activity([handle], 0.1)
    print(f"GPU: {name}, driver {driver}, GPM {'supported' if probe else 'not supported'}")

    workloads: list[tuple[str, int | None, Callable[[], None]]] = [
        ("decode-1", 1, decode(torch, 1, args.dim, args.layers)),
        ("decode-256", 256, decode(torch, 256, args.dim, args.layers)),
        ("gemm", None, gemm(torch, args.gemm_dim)),  # not sequences: no seats
    ]
    header = (
        f"{'workload':<11} {'seats':>9} {'util.gpu':>9} {'SM act':>8} {'tensor':>8}"
        f" {'load':>6} {'signal':<16} {'gate':<7} {'steps/s':>9}"
    )
    print(header)
    heavy_load: dict[str, bool] = {}
    for label, sequences, run in workloads:
        reading = measure(torch, label, run, args.seconds)
        load = engine_load(
            kv_cache_usage=None, reserved_fraction=None, tensor_activity=reading.tensor_activity
        )
        occupancy = None if sequences is None else min(1.0, sequences / args.seats)
        heavy_load[label] = load.value >= args.threshold
        # Online work shuts the gate by the samplers' load or by its seats at the threshold.
        shut = heavy_load[label] or (occupancy is not None and occupancy >= args.threshold)
        print(
            f"{label:<11} {percent(occupancy):>9} {reading.utilization_gpu:>9.1%}"
            f" {percent(reading.sm_activity):>8} {percent(reading.tensor_activity):>8}"
            f" {load.value:>6.2f} {load.signal or '-':<16} {'shut' if shut else 'open':<7}"
            f" {reading.steps_per_s:>9.0f}"
        )
    if probe is None:
        print("without GPM the load of a GPU is its engine's KV usage and seats only")
        return 2
    # Measured, not assumed: the load alone (tensor activity), not the seats the workload
    # stands for, must tell one decoding sequence from 256.
    passed = not heavy_load["decode-1"] and heavy_load["decode-256"]
    print(
        "PASS: by its load, one decoding sequence reads as light, 256 as heavy"
        if passed
        else "FAIL: by its load, one decoding sequence must read light and 256 heavy"
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
