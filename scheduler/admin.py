from django.contrib import admin

from scheduler.models import Device, Engine
from scheduler.units import format_units


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
class EngineAdmin(admin.ModelAdmin[Engine]):
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
    # Status, pid and KV capacity are the supervisor's to write (manage.py engine ...).
    readonly_fields = (
        "status",
        "status_detail",
        "kv_capacity_tokens",
        "block_size",
        "pid",
        "started_at",
        "updated_at",
    )

    @admin.display(description="footprint", ordering="footprint_units")
    def footprint(self, engine: Engine) -> str:
        return format_units(engine.footprint_units)

    @admin.display(description="tenant")
    def owner(self, engine: Engine) -> str:
        return engine.dedicated_tenant.slug if engine.dedicated_tenant else "shared"
