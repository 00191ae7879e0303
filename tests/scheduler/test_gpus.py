"""GPU discovery: with GPUs, without a driver, and when NVML misbehaves."""

from io import StringIO

import pynvml
import pytest
from django.core.management import call_command

from capacity.units import GIB
from scheduler import gpu_inventory
from scheduler.gpu_inventory import GpuInfo, Inventory, discover_gpus, sample_gpus
from scheduler.models import Device, DeviceKind


def nvml_error(code: int):
    def raise_it(*args: object) -> None:
        raise pynvml.NVMLError(code)

    return raise_it


def test_without_a_driver_discovery_says_so_and_never_raises(monkeypatch) -> None:
    monkeypatch.setattr(pynvml, "nvmlInit", nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    inventory = discover_gpus()
    assert not inventory.available
    assert "no NVIDIA driver" in inventory.reason
    assert sample_gpus() == []


def test_an_nvml_error_mid_discovery_is_reported_not_raised(monkeypatch) -> None:
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: "550.54")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST))
    inventory = discover_gpus()
    assert not inventory.available
    assert inventory.reason.startswith("NVML failed")


@pytest.mark.django_db
def test_a_machine_without_a_driver_registers_its_cpu_device(monkeypatch, settings) -> None:
    settings.GPUSHARE_NODE_NAME = "laptop"
    settings.GPUSHARE_CPU_KVCACHE_GIB = 3
    monkeypatch.setattr(pynvml, "nvmlInit", nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    out = StringIO()
    call_command("gpus", "discover", stdout=out)
    assert "laptop: no NVIDIA GPU (no NVIDIA driver on this machine" in out.getvalue()
    cpu = Device.objects.get(node="laptop", kind=DeviceKind.CPU)
    assert cpu.capacity_units == 12
    assert cpu.key == "laptop/cpu0"
    assert "laptop/cpu0" in out.getvalue()


@pytest.mark.django_db
def test_gpus_are_recorded_with_capacity_in_units_and_vanished_ones_marked(
    monkeypatch, settings
) -> None:
    settings.GPUSHARE_NODE_NAME = "node1"
    two = Inventory(
        available=True,
        driver_version="550.54",
        gpus=[
            GpuInfo(0, "GPU-aaa", "NVIDIA A100-SXM4-80GB", 80 * GIB),
            GpuInfo(1, "GPU-bbb", "NVIDIA L4", 23034 * 1024 * 1024),
        ],
    )
    monkeypatch.setattr("scheduler.management.commands.gpus.discover_gpus", lambda: two)
    call_command("gpus", "discover", stdout=StringIO())
    a100, l4 = Device.objects.filter(node="node1").order_by("index")
    assert (a100.capacity_units, a100.uuid) == (320, "GPU-aaa")
    assert l4.capacity_units == 89  # 22.49 GiB: whole units only
    one = Inventory(available=True, driver_version="550.54", gpus=two.gpus[:1])
    monkeypatch.setattr("scheduler.management.commands.gpus.discover_gpus", lambda: one)
    call_command("gpus", "discover", stdout=StringIO())
    l4.refresh_from_db()
    assert not l4.is_present


def test_node_name_defaults_to_the_host_name() -> None:
    assert gpu_inventory.node_name("") != ""
    assert gpu_inventory.node_name("gpu-node-7") == "gpu-node-7"
