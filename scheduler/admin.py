from typing import Any

from django.contrib import admin

from audit.admin import AuditedAdmin
from capacity.units import format_units
from scheduler.batches.objects import batch_object, batch_progress_percent
from scheduler.batches.selectors import batch_list_for_staff
from scheduler.models import Batch, Device, Engine, StoredFile


class EngineInline(admin.TabularInline[Engine, Device]):
    model = Engine
    extra = 0
    fields = ("name", "served_model_name", "footprint_units", "status", "port")
    readonly_fields = fields
    can_delete = False
    show_change_link = True


@admin.register(Device)
class DeviceAdmin(admin.ModelAdmin[Device]):
    list_display = ("key", "name", "kind", "capacity", "is_present", "updated_at")
    list_filter = ("node", "kind", "is_present")
    search_fields = ("node", "name", "uuid")
    readonly_fields = ("discovered_at", "updated_at")
    inlines = (EngineInline,)

    @admin.display(description="device")
    def key(self, device: Device) -> str:
        return device.key

    @admin.display(description="capacity", ordering="capacity_units")
    def capacity(self, device: Device) -> str:
        return format_units(device.capacity_units)


@admin.register(Engine)
class EngineAdmin(AuditedAdmin[Engine]):
    list_display = (
        "name",
        "served_model_name",
        "device",
        "footprint",
        "status",
        "kv_capacity_tokens",
        "owner",
        "base_url",
    )
    list_filter = ("status", "served_model_name", "device__node")
    search_fields = ("name", "served_model_name", "model_path")
    list_select_related = ("device", "dedicated_tenant")
    # Status, pid, KV capacity and health are the supervisor's to write (manage.py engine ...).
    readonly_fields = (
        "status",
        "status_detail",
        "kv_capacity_tokens",
        "block_size",
        "pid",
        "started_at",
        "health_misses",
        "updated_at",
    )

    @admin.display(description="footprint", ordering="footprint_units")
    def footprint(self, engine: Engine) -> str:
        return format_units(engine.footprint_units)

    @admin.display(description="tenant")
    def owner(self, engine: Engine) -> str:
        return engine.dedicated_tenant.slug if engine.dedicated_tenant else "shared"


# --- files and batches ---------------------------------------------------------------------


@admin.register(StoredFile)
class StoredFileAdmin(admin.ModelAdmin[StoredFile]):
    list_display = ("public_id", "tenant", "purpose", "filename", "size_bytes", "created_at")
    list_filter = ("purpose",)
    search_fields = ("public_id", "filename", "tenant__slug")
    readonly_fields = (
        "public_id",
        "tenant",
        "purpose",
        "size_bytes",
        "relative_path",
        "created_at",
    )


@admin.register(Batch)
class BatchAdmin(admin.ModelAdmin[Batch]):
    list_display = (
        "public_id",
        "tenant",
        "status",
        "progress",
        "lines",
        "created_at",
        "expires_at",
    )
    list_filter = ("status", "endpoint")
    search_fields = ("public_id", "tenant__slug", "input_file_id")
    readonly_fields = (
        "public_id",
        "tenant",
        "api_key",
        "endpoint",
        "input_file_id",
        "output_file_id",
        "error_file_id",
        "errors",
        "stop_reason",
        "created_at",
        "in_progress_at",
        "finalizing_at",
        "completed_at",
        "failed_at",
        "expired_at",
        "cancelling_at",
        "cancelled_at",
    )

    def get_queryset(self, request: Any) -> Any:
        return batch_list_for_staff()

    @admin.display(description="progress")
    def progress(self, batch: Batch) -> str:
        return f"{batch_progress_percent(batch):g}%"

    @admin.display(description="lines (done/failed/total)")
    def lines(self, batch: Batch) -> str:
        counts = batch_object(batch)["request_counts"]
        return f"{counts['completed']}/{counts['failed']}/{counts['total']}"


# --- Pools and scaling ------------------------------------------------------------------

from scheduler.models import Pool, ScalingDecision  # noqa: E402


@admin.register(Pool)
class PoolAdmin(AuditedAdmin[Pool]):
    list_display = (
        "served_model_name",
        "enabled",
        "hot_size",
        "cold_max",
        "target_wait_s",
        "target_depth",
        "sustain_s",
        "quiet_period_s",
    )
    list_filter = ("enabled",)


@admin.register(ScalingDecision)
class ScalingDecisionAdmin(admin.ModelAdmin[ScalingDecision]):
    """The scaler's log: read only (the scaler writes it)."""

    list_display = ("at", "pool", "action", "code", "outcome", "reason")
    list_filter = ("pool", "action", "outcome")
    readonly_fields = (
        "pool",
        "at",
        "action",
        "code",
        "reason",
        "engines",
        "outcome",
        "remaining",
        "outcome_detail",
        "finished_at",
    )

    def has_add_permission(self, request: Any) -> bool:
        return False


from scheduler.adapters.models import Adapter  # noqa: E402
from scheduler.adapters.services import adapter_remove  # noqa: E402


@admin.register(Adapter)
class AdapterAdmin(admin.ModelAdmin[Adapter]):
    """Tenants' LoRA adapters: registered with `manage.py adapter register` (their files go
    to the files storage); deleting one here unloads it from the engines and deletes its
    files, as `manage.py adapter remove` does."""

    list_display = ("name", "tenant", "base_model", "rank", "units_display", "created_at")
    list_filter = ("base_model",)
    search_fields = ("name", "tenant__slug", "base_model")
    list_select_related = ("tenant",)
    readonly_fields = (
        "name", "tenant", "base_model", "rank", "size_bytes", "units", "storage_prefix",
        "created_at",
    )  # fmt: skip

    def has_add_permission(self, request: Any) -> bool:
        return False

    def delete_model(self, request: Any, obj: Adapter) -> None:
        adapter_remove(adapter=obj)

    def delete_queryset(self, request: Any, queryset: Any) -> None:
        for adapter in queryset:
            adapter_remove(adapter=adapter)
