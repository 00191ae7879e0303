"""What runs where: devices (GPUs, or the CPU standing in for one) and vLLM engines on them.

Every amount of memory is in 256 MiB units (capacity.units): a device's capacity, an
engine's footprint.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import models
from django.db.models import Q

from capacity.units import format_units


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


class EngineTask(models.TextChoices):
    """What an engine's model does: generate text (chat, completions) or embed it (vLLM's
    pooling runner, `--runner pooling`: a generative checkpoint is adapted to embed)."""

    GENERATE = "generate", "generate"
    EMBED = "embed", "embed"


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
    task = models.CharField(
        max_length=10,
        choices=EngineTask.choices,
        default=EngineTask.GENERATE,
        help_text="generate: chat and completions; embed: /v1/embeddings.",
    )
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
        default=32,
        help_text=(
            "Most requests it runs at once (its seats). The scheduler may send more, up to "
            "GPUSHARE_ENGINE_QUEUED_PER_SEAT per seat, to wait in its queue for a seat."
        ),
    )
    offline_load_threshold = models.FloatField(
        default=0.4, help_text="Offline work runs only while its load is below this (0..1)."
    )
    max_loras = models.PositiveSmallIntegerField(
        default=0,
        help_text=(
            "LoRA adapters it holds loaded at once (vLLM's --max-loras); 0: it serves none. "
            "Each holds a slot of its KV budget (scheduler.adapters)."
        ),
    )
    max_lora_rank = models.PositiveSmallIntegerField(
        default=16, help_text="Highest rank of an adapter it can load (vLLM's --max-lora-rank)."
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
    health_misses = models.PositiveSmallIntegerField(
        default=0, help_text="Periodic /health checks missed in a row while ready."
    )
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


# --- Files and batches ----------------------------------------------------------------


class FilePurpose(models.TextChoices):
    BATCH = "batch", "batch"
    BATCH_OUTPUT = "batch_output", "batch_output"


class StoredFile(models.Model):
    """A file a tenant uploaded (a batch's JSONL input) or a batch wrote (its output and
    errors). The bytes live in the files storage (`scheduler.batches.storage`) under
    `relative_path`; this row is the index."""

    public_id = models.CharField(max_length=64, unique=True)
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.CASCADE, related_name="stored_files"
    )
    purpose = models.CharField(max_length=16, choices=FilePurpose.choices)
    filename = models.CharField(max_length=255)
    size_bytes = models.PositiveBigIntegerField()
    relative_path = models.CharField(max_length=300, help_text="Under the files folder.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("-pk",)
        indexes = (models.Index(fields=("tenant", "purpose"), name="file_tenant_purpose"),)

    def __str__(self) -> str:
        return self.public_id


class BatchStatus(models.TextChoices):
    VALIDATING = "validating", "validating"
    FAILED = "failed", "failed"
    IN_PROGRESS = "in_progress", "in_progress"
    FINALIZING = "finalizing", "finalizing"
    COMPLETED = "completed", "completed"
    EXPIRED = "expired", "expired"
    CANCELLING = "cancelling", "cancelling"
    CANCELLED = "cancelled", "cancelled"


# Batches the feeder still has work for.
ACTIVE_BATCH_STATUSES = (
    BatchStatus.VALIDATING,
    BatchStatus.IN_PROGRESS,
    BatchStatus.FINALIZING,
    BatchStatus.CANCELLING,
)


class BatchStop(models.TextChoices):
    """Why a batch stopped admitting lines before all had run; empty while it runs."""

    NONE = "", "none"
    CANCELLED = "cancelled", "cancelled"
    EXPIRED = "expired", "expired"
    BUDGET = "budget", "token budget used up"


class Batch(models.Model):
    """An OpenAI-style batch: lines of one input file run as offline work.

    The database is the source of truth for which lines are done (BatchLine.state); the fair
    queue in Redis only holds the window of lines in flight, and is refilled from here."""

    public_id = models.CharField(max_length=64, unique=True)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="batches")
    api_key = models.ForeignKey(
        "tenants.ApiKey", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    endpoint = models.CharField(max_length=64)
    input_file_id = models.CharField(max_length=64)
    completion_window = models.CharField(max_length=8, default="24h")
    metadata = models.JSONField(null=True, blank=True)
    status = models.CharField(
        max_length=12, choices=BatchStatus.choices, default=BatchStatus.VALIDATING
    )
    stop_reason = models.CharField(max_length=12, choices=BatchStop.choices, blank=True)
    errors = models.JSONField(null=True, blank=True, help_text="OpenAI's errors object.")
    output_file_id = models.CharField(max_length=64, blank=True)
    error_file_id = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    in_progress_at = models.DateTimeField(null=True, blank=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-pk",)
        verbose_name_plural = "batches"
        indexes = (models.Index(fields=("status",), name="batch_status"),)

    def __str__(self) -> str:
        return self.public_id


class LineState(models.TextChoices):
    PENDING = "pending", "pending"  # not in the fair queue
    QUEUED = "queued", "queued"  # handed to the fair queue (waiting or running there)
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    EXPIRED = "expired", "expired"
    CANCELLED = "cancelled", "cancelled"


UNFINISHED_LINE_STATES = (LineState.PENDING, LineState.QUEUED)


class JSONText(models.TextField[Any, Any]):
    """A JSON value kept as its text, not as jsonb: jsonb cannot hold the character U+0000,
    which models do write (the tiny test model often does; PostgreSQL refused such answers
    and their lines ran again). The text keeps it escaped, as `\\u0000`."""

    # What django-stubs' mypy plugin reads as the field's Python type (a JSON value).
    _pyi_private_set_type: Any
    _pyi_private_get_type: Any

    def from_db_value(self, value: str | None, expression: Any, connection: Any) -> Any:
        return None if value is None else json.loads(value)

    def to_python(self, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value

    def get_prep_value(self, value: Any) -> str | None:
        return None if value is None else json.dumps(value)

    def value_to_string(self, obj: Any) -> str:  # the admin's and serializers' text
        return json.dumps(self.value_from_object(obj), indent=1)


class BatchLine(models.Model):
    """One request of a batch and, once it ran, its result: written once, because only an
    unfinished line can be finished (a job that ran twice finds the line already done)."""

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="lines")
    index = models.PositiveIntegerField(help_text="1-based line number in the input file.")
    custom_id = models.CharField(max_length=512)
    model = models.CharField(max_length=200)
    body = models.JSONField()
    state = models.CharField(max_length=10, choices=LineState.choices, default=LineState.PENDING)
    job_id = models.CharField(max_length=64, blank=True, help_text="Its current fair-queue job.")
    job_pool = models.CharField(
        max_length=255, blank=True, help_text="The fair-queue pool its current job is in."
    )
    runs = models.PositiveIntegerField(default=0, help_text="Times it was handed to the queue.")
    fed_at = models.DateTimeField(null=True, blank=True)
    # First time the feeder saw its job ended in Redis without a result here: after a grace
    # period the line is fed again (the worker died between the engine's answer and the write).
    lost_seen_at = models.DateTimeField(null=True, blank=True)
    response = JSONText(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("batch", "index")
        constraints = (
            models.UniqueConstraint(
                fields=("batch", "custom_id"), name="batchline_unique_custom_id"
            ),
            models.UniqueConstraint(fields=("batch", "index"), name="batchline_unique_index"),
        )
        indexes = (models.Index(fields=("batch", "state", "index"), name="batchline_feed"),)

    def __str__(self) -> str:
        return f"{self.batch_id}:{self.custom_id}"


# --- Pools and scaling ------------------------------------------------------------------


class Pool(models.Model):
    """The shared engines of one served model, and how many of them should run.

    `hot_size` engines always run; up to `cold_max` more (the cold pool) are started when the
    pool's online queue stays over target, or ahead of a scheduled peak, and drained then
    stopped after a quiet period. Every engine of the pool is created from, and started
    with, the launch profile below, so a cold engine is the same as a hot one."""

    served_model_name = models.CharField(max_length=200, unique=True)
    enabled = models.BooleanField(default=True, help_text="Off: the scaler leaves it alone.")
    hot_size = models.PositiveIntegerField(default=1, help_text="Engines always running.")
    cold_max = models.PositiveIntegerField(
        default=0, help_text="Most engines started on top of the hot ones."
    )
    # Scale-up: the online queue (interactive + standard) over either target, sustained.
    target_wait_s = models.FloatField(
        default=5.0, help_text="Oldest online job's wait above which the pool is short."
    )
    target_depth = models.PositiveIntegerField(
        default=16, help_text="Waiting online jobs at or above which the pool is short."
    )
    sustain_s = models.PositiveIntegerField(
        default=60, help_text="How long the queue must stay over target before a start."
    )
    quiet_period_s = models.PositiveIntegerField(
        default=600, help_text="How long the pool must be quiet before a cold engine drains."
    )
    peak_lead_s = models.PositiveIntegerField(
        default=1200, help_text="How long before a scheduled peak its engines are started."
    )
    peaks = models.JSONField(
        default=list,
        blank=True,
        help_text=(
            'Expected peaks: [{"name": "lunch", "days": [0, 1, 2, 3, 4], "start": "11:30", '
            '"end": "13:30", "extra": 2}]; days 0 = Monday, times in `timezone`.'
        ),
    )
    timezone = models.CharField(max_length=64, default="UTC")
    # The launch profile of every engine of the pool.
    model_path = models.CharField(max_length=500)
    footprint_units = models.PositiveIntegerField()
    max_model_len = models.PositiveIntegerField(default=2048)
    max_num_seqs = models.PositiveIntegerField(default=32)
    offline_load_threshold = models.FloatField(default=0.4)
    max_loras = models.PositiveSmallIntegerField(default=0, help_text="Its engines' --max-loras.")
    max_lora_rank = models.PositiveSmallIntegerField(default=16)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("served_model_name",)
        constraints = (
            models.CheckConstraint(condition=Q(footprint_units__gte=1), name="pool_footprint_1"),
            models.CheckConstraint(
                condition=Q(offline_load_threshold__gte=0) & Q(offline_load_threshold__lte=1),
                name="pool_offline_threshold_0_1",
            ),
        )

    def __str__(self) -> str:
        return self.served_model_name

    @property
    def max_engines(self) -> int:
        return self.hot_size + self.cold_max


class ScalingAction(models.TextChoices):
    START = "start", "start"
    DRAIN = "drain", "drain"
    HOLD = "hold", "hold"


class DecisionOutcome(models.TextChoices):
    PENDING = "pending", "pending"  # sent to the engines' node, not done yet
    DONE = "done", "done"
    FAILED = "failed", "failed"
    NONE = "none", "none"  # a hold: nothing to carry out


class ScalingDecision(models.Model):
    """One decision of the scaler about a pool, with its reason and how carrying it out
    went. Starts and drains are all kept; a hold only when its reason changes."""

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="decisions")
    at = models.DateTimeField()
    action = models.CharField(max_length=5, choices=ScalingAction.choices)
    code = models.CharField(max_length=40, help_text="The rule that decided, e.g. sustained.")
    reason = models.TextField()
    engines = models.JSONField(default=list, blank=True, help_text="Engines started or drained.")
    outcome = models.CharField(
        max_length=7, choices=DecisionOutcome.choices, default=DecisionOutcome.NONE
    )
    remaining = models.PositiveIntegerField(default=0, help_text="Engines not yet carried out.")
    outcome_detail = models.TextField(blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-at", "-pk")
        indexes = (models.Index(fields=("pool", "-at"), name="scalingdecision_pool_at"),)

    def __str__(self) -> str:
        return f"{self.pool_id} {self.action} {self.at:%Y-%m-%d %H:%M:%S}"


class PoolTargets(models.Model):
    """One pool's seat bounds in place of the settings' (GPUSHARE_TTFT_TARGETS_MS and
    GPUSHARE_FIXED_SEATS_BELOW): by pool id (`scheduler.pools.policies.pool_id`), so a pool of
    engines registered one by one has them too. A field left null takes the settings'; an
    empty mapping sets none for the pool."""

    pool = models.CharField(max_length=300, unique=True)
    ttft_targets_ms = models.JSONField(
        null=True, blank=True, help_text='By class, e.g. {"interactive": 300}; null: settings.'
    )
    fixed_seats_below = models.JSONField(
        null=True, blank=True, help_text='By class, e.g. {"interactive": 4}; null: settings.'
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("pool",)
        verbose_name_plural = "pool targets"

    def __str__(self) -> str:
        return self.pool


class PoolReservation(models.Model):
    """One pool's KV reservation mode in place of the settings' (GPUSHARE_KV_RESERVATION), by
    pool id: `predict` (a job reserves its prompts and a prediction of its output, growing as
    it generates) or `worst` (its prompts and every token it may generate: strict isolation).
    docs/ARCHITECTURE.md, Reserving KV."""

    class Mode(models.TextChoices):
        PREDICT = "predict", "predict"
        WORST = "worst", "worst case"

    pool = models.CharField(max_length=300, unique=True)
    mode = models.CharField(max_length=16, choices=Mode.choices)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("pool",)

    def __str__(self) -> str:
        return f"{self.pool}: {self.mode}"


# --- LoRA adapters (scheduler.adapters) -----------------------------------------------

# Defined in its subject's package, registered with the app here.
from scheduler.adapters.models import Adapter  # noqa: E402, F401
