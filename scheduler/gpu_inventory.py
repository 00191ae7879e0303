"""What GPUs this node has, through pynvml (package `nvidia-ml-py`).

A thin wrapper that never raises pynvml's errors: a machine without the NVIDIA driver (a
laptop, CI) gets `available=False` and a plain reason, and a GPU that fails to answer one
query is reported without that field rather than taking the platform down. The telemetry
samplers use `sample_gpus` the same way.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import pynvml


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    memory_bytes: int


@dataclass(frozen=True)
class GpuSample:
    """A moment of one GPU's life, for telemetry. None where the GPU did not answer."""

    index: int
    utilization_percent: int | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None


@dataclass(frozen=True)
class Inventory:
    available: bool
    reason: str = ""
    driver_version: str = ""
    gpus: list[GpuInfo] = field(default_factory=list)


def node_name(configured: str = "") -> str:
    """This node's name for device records: the setting if given, else the host name."""
    return configured or socket.gethostname()


class NvmlUnavailable(Exception):
    pass


def _text(value: Any) -> str:
    # pynvml returns str on recent versions, bytes on old ones.
    return value.decode() if isinstance(value, bytes) else str(value)


def _explain(error: pynvml.NVMLError) -> str:
    code = getattr(error, "value", None)
    if code in (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED):
        return "no NVIDIA driver on this machine (libnvidia-ml not found or not loaded)"
    return f"NVML failed: {error}"


@contextmanager
def nvml_session() -> Iterator[None]:
    """nvmlInit/nvmlShutdown; raises NvmlUnavailable with a readable reason."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(_explain(exc)) from exc
    except OSError as exc:  # a broken library install
        raise NvmlUnavailable(f"NVML could not be loaded: {exc}") from exc
    try:
        yield
    finally:
        # Shutting down a session that is going away anyway: nothing to do if it fails.
        with suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _gpu_info(index: int) -> GpuInfo:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return GpuInfo(
        index=index,
        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
        name=_text(pynvml.nvmlDeviceGetName(handle)),
        memory_bytes=int(memory.total),
    )


def discover_gpus() -> Inventory:
    """Every GPU pynvml sees. Never raises: without a driver, `available` is False."""
    try:
        with nvml_session():
            driver = _text(pynvml.nvmlSystemGetDriverVersion())
            count = pynvml.nvmlDeviceGetCount()
            gpus = [_gpu_info(index) for index in range(count)]
    except NvmlUnavailable as exc:
        return Inventory(available=False, reason=str(exc))
    except pynvml.NVMLError as exc:
        return Inventory(available=False, reason=_explain(exc))
    if not gpus:
        return Inventory(available=False, reason="the NVIDIA driver reports no GPU")
    return Inventory(available=True, driver_version=driver, gpus=gpus)


def _sample_one(index: int) -> GpuSample:
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError:
        return GpuSample(index, None, None, None)
    utilization: int | None
    used: int | None
    total: int | None
    try:
        utilization = int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except pynvml.NVMLError:
        utilization = None
    try:
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        used, total = int(memory.used), int(memory.total)
    except pynvml.NVMLError:
        used = total = None
    return GpuSample(index, utilization, used, total)


def sample_gpus() -> list[GpuSample]:
    """Utilisation and memory of every GPU now; empty without a driver. Never raises."""
    try:
        with nvml_session():
            return [_sample_one(index) for index in range(pynvml.nvmlDeviceGetCount())]
    except (NvmlUnavailable, pynvml.NVMLError):
        return []


# --- GPM: how much of the GPU the work uses (Hopper and later) ------------------------------

# `utilization.gpu` (nvmlDeviceGetUtilizationRates) is the share of time any kernel ran: one
# sequence decoding reads 100 % while it uses a few percent of the chip. GPM's metrics are
# rates over two samples: SM activity (the share of SMs busy; a batch-1 decode still keeps
# most of them busy at a low rate) and tensor activity (the share of time the SMs ran tensor
# instructions: low for one decoding sequence, high for a full batch or a large GEMM).
GPM_METRICS = {
    "sm_activity": pynvml.NVML_GPM_METRIC_SM_UTIL,
    "tensor_activity": pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
}


@dataclass(frozen=True)
class GpmActivity:
    """GPM's activity of one GPU over a window, 0..1; None where the metric did not answer."""

    sm_activity: float | None
    tensor_activity: float | None


def _gpm_supported(handle: Any) -> bool:
    try:
        return bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except (pynvml.NVMLError, AttributeError):  # older drivers and bindings have no GPM
        return False


def _gpm_metrics(first: Any, second: Any) -> GpmActivity:
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(GPM_METRICS)
    request.sample1, request.sample2 = first, second
    for slot, metric in enumerate(GPM_METRICS.values()):
        request.metrics[slot].metricId = metric
    pynvml.nvmlGpmMetricsGet(request)
    values: dict[str, float | None] = {}
    for slot, name in enumerate(GPM_METRICS):
        metric = request.metrics[slot]
        ok = metric.nvmlReturn == pynvml.NVML_SUCCESS
        values[name] = min(1.0, max(0.0, float(metric.value) / 100.0)) if ok else None
    return GpmActivity(**values)


def gpm_activity(handles: Sequence[Any], window_s: float) -> list[GpmActivity | None]:
    """GPM activity of each GPU (by its NVML handle, inside an `nvml_session`) over one window
    of `window_s` seconds, all GPUs at once; None for a GPU without GPM (before Hopper, or a
    driver or binding without it). Sleeps `window_s` when any GPU has GPM: call it from a
    thread, never from an event loop. Never raises pynvml's errors."""
    samples: dict[int, tuple[Any, Any]] = {}
    for index, handle in enumerate(handles):
        if not _gpm_supported(handle):
            continue
        pair: list[Any] = []
        try:
            pair = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
            pynvml.nvmlGpmSampleGet(handle, pair[0])
            samples[index] = (pair[0], pair[1])
        except pynvml.NVMLError:
            _gpm_free(pair)
    activity: list[GpmActivity | None] = [None] * len(handles)
    if samples:
        time.sleep(window_s)
    for index, (first, second) in samples.items():
        try:
            pynvml.nvmlGpmSampleGet(handles[index], second)
            activity[index] = _gpm_metrics(first, second)
        except pynvml.NVMLError:
            pass
        finally:
            _gpm_free([first, second])
    return activity


def _gpm_free(samples: Sequence[Any]) -> None:
    for sample in samples:
        with suppress(pynvml.NVMLError):
            pynvml.nvmlGpmSampleFree(sample)
