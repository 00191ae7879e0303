"""Sampled telemetry history: GPUs (pynvml) and engines (vLLM /metrics).

Live values are in Redis (telemetry.sampling); these tables keep the history, downsampled as
it ages: raw samples for a day, per-minute means for a month, per-hour means after that,
until the retention setting drops them. Each row says which resolution it is and how many
raw samples it stands for, so a later fold can weigh it.

A field a device does not have (a CPU has no SM utilisation, temperature or power) is NULL,
never a made-up zero.
"""

from __future__ import annotations

from django.db import models


class Resolution(models.TextChoices):
    RAW = "raw", "raw"
    MINUTE = "minute", "minute"
    HOUR = "hour", "hour"


class Sample(models.Model):
    """What every history row has: its resolution, its time and how many samples it holds."""

    resolution = models.CharField(max_length=6, choices=Resolution.choices)
    at = models.DateTimeField(help_text="Sample time, or the start of the bucket.")
    samples = models.PositiveIntegerField(default=1)

    VALUE_FIELDS: tuple[str, ...] = ()
    SERIES_FIELDS: tuple[str, ...] = ()

    class Meta:
        abstract = True


class GpuSample(Sample):
    node = models.CharField(max_length=200)
    gpu_index = models.PositiveIntegerField()
    utilization_percent = models.FloatField(null=True, blank=True)
    memory_used_bytes = models.FloatField(null=True, blank=True)
    memory_total_bytes = models.FloatField(null=True, blank=True)
    temperature_c = models.FloatField(null=True, blank=True)
    power_w = models.FloatField(null=True, blank=True)

    SERIES_FIELDS = ("node", "gpu_index")
    VALUE_FIELDS = (
        "utilization_percent",
        "memory_used_bytes",
        "memory_total_bytes",
        "temperature_c",
        "power_w",
    )

    class Meta:
        ordering = ("node", "gpu_index", "at")
        indexes = (models.Index(fields=("resolution", "at"), name="gpusample_res_at"),)

    def __str__(self) -> str:
        return f"{self.node}/gpu{self.gpu_index} {self.resolution} {self.at:%Y-%m-%d %H:%M:%S}"


class EngineSample(Sample):
    """One engine's numbers. The engine is named, not a foreign key: its history outlives
    the engine's row."""

    engine = models.CharField(max_length=100)
    model = models.CharField(max_length=200)
    load = models.FloatField(null=True, blank=True)
    gpu_utilization = models.FloatField(
        null=True, blank=True, help_text="Smoothed utilisation of its GPU, 0..1; NULL on CPU."
    )
    kv_cache_usage = models.FloatField(null=True, blank=True)
    reserved_fraction = models.FloatField(null=True, blank=True)
    requests_running = models.FloatField(null=True, blank=True)
    requests_waiting = models.FloatField(null=True, blank=True)
    preemptions = models.FloatField(
        null=True,
        blank=True,
        help_text="Preemptions per sample interval (a mean in a bucket: x samples = its total).",
    )
    ttft_mean_s = models.FloatField(null=True, blank=True)

    SERIES_FIELDS = ("engine", "model")
    VALUE_FIELDS = (
        "load",
        "gpu_utilization",
        "kv_cache_usage",
        "reserved_fraction",
        "requests_running",
        "requests_waiting",
        "preemptions",
        "ttft_mean_s",
    )

    class Meta:
        ordering = ("engine", "at")
        indexes = (models.Index(fields=("resolution", "at"), name="enginesample_res_at"),)

    def __str__(self) -> str:
        return f"{self.engine} {self.resolution} {self.at:%Y-%m-%d %H:%M:%S}"
