"""What runs where: devices (GPUs, or the CPU standing in for one) and vLLM engines on them.

Every amount of memory is in 256 MiB units (scheduler.units): a device's capacity, an
engine's footprint.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from scheduler.units import format_units


class DeviceKind(models.TextChoices):
    GPU = "gpu", "GPU"
    CPU = "cpu", "CPU"


class Device(models.Model):
    """A GPU found by pynvml on a node, or the node's CPU when it has no NVIDIA driver
    (then its capacity is the KV space configured for the CPU engine)."""

    node = models.CharField(max_length=200, help_text="Host name of the node it is on.")
    kind = models.CharField(max_length=3, choices=DeviceKind.choices)
    index = models.PositiveIntegerField(help_text="CUDA index on its node (0 for the CPU).")
    uuid = models.CharField(max_length=100, blank=True, help_text="NVIDIA UUID; empty for CPU.")
    name = models.CharField(max_length=200, help_text="Model name, e.g. NVIDIA A100-SXM4-80GB.")
    memory_bytes = models.PositiveBigIntegerField(help_text="Total memory of the device.")
    capacity_units = models.PositiveIntegerField(
        help_text="Units engines may hold on it: total memory (or CPU KV space) in 256 MiB units."
    )
    is_present = models.BooleanField(
        default=True, help_text="Seen by the last discovery on its node."
    )
    discovered_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("node", "kind", "index")
        constraints = (
            models.UniqueConstraint(fields=("node", "kind", "index"), name="device_unique_slot"),
        )

    def __str__(self) -> str:
        return self.key

    @property
    def key(self) -> str:
        """How operators name a device: `node/gpu0`, `node/cpu0`."""
        return f"{self.node}/{self.kind}{self.index}"

    @property
    def capacity_display(self) -> str:
        return format_units(self.capacity_units)


class EngineStatus(models.TextChoices):
    STARTING = "starting", "starting"
    WARMING = "warming", "warming"
    READY = "ready", "ready"
    DRAINING = "draining", "draining"
    STOPPED = "stopped", "stopped"
    FAILED = "failed", "failed"


# States in which the engine's process should be alive and holds its units.
LIVE_STATUSES = (
    EngineStatus.STARTING,
    EngineStatus.WARMING,
    EngineStatus.READY,
    EngineStatus.DRAINING,
)


class Engine(models.Model):
    """One vLLM OpenAI-compatible server serving one model on one device.

    Engines with the same served model name form that model's pool. Only a `ready` engine
    takes work; `draining` lets in-flight work finish before it stops.
    """

    name = models.SlugField(max_length=64, unique=True)
    model_path = models.CharField(max_length=500, help_text="Model folder given to --model.")
    served_model_name = models.CharField(
        max_length=200, help_text="The name clients ask for; engines sharing it form a pool."
    )
    device = models.ForeignKey(Device, on_delete=models.PROTECT, related_name="engines")
    footprint_units = models.PositiveIntegerField(
        help_text="Memory it holds on its device (weights + KV cache), in 256 MiB units."
    )
    host = models.CharField(max_length=200, default="127.0.0.1")
    port = models.PositiveIntegerField()
    status = models.CharField(
        max_length=10, choices=EngineStatus.choices, default=EngineStatus.STOPPED
    )
    status_detail = models.TextField(blank=True, help_text="Why it is in its status.")
    kv_capacity_tokens = models.PositiveIntegerField(
        null=True, blank=True, help_text="KV cache in tokens, read back from the running engine."
    )
    block_size = models.PositiveIntegerField(default=16, help_text="Tokens per KV block.")
    max_model_len = models.PositiveIntegerField(default=2048)
    max_num_seqs = models.PositiveIntegerField(
        default=32, help_text="Most requests it runs at once; the scheduler never sends more."
    )
    offline_load_threshold = models.FloatField(
        default=0.4, help_text="Offline work runs only while its load is below this (0..1)."
    )
    dedicated_tenant = models.ForeignKey(
        "tenants.Tenant",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="dedicated_engines",
        help_text="Empty: shared by all tenants. Set: only this tenant, against its quota.",
    )
    pid = models.PositiveIntegerField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("served_model_name", "name")
        constraints = (
            models.UniqueConstraint(fields=("host", "port"), name="engine_unique_address"),
            models.CheckConstraint(
                condition=Q(offline_load_threshold__gte=0) & Q(offline_load_threshold__lte=1),
                name="engine_offline_threshold_0_1",
            ),
            models.CheckConstraint(
                condition=Q(footprint_units__gte=1), name="engine_footprint_positive"
            ),
        )

    def __str__(self) -> str:
        return self.name

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def is_shared(self) -> bool:
        return self.dedicated_tenant_id is None

    @property
    def is_live(self) -> bool:
        return self.status in LIVE_STATUSES

    @property
    def footprint_display(self) -> str:
        return format_units(self.footprint_units)
