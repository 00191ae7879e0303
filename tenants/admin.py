from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from audit.admin import AuditedAdmin
from capacity.units import format_units
from tenants.keys import new_key_material
from tenants.models import ApiKey, Invitation, Membership, Tenant, UsageRecord
from tenants.services import api_keys_revoke


class ApiKeyInline(admin.TabularInline[ApiKey, Tenant]):
    model = ApiKey
    extra = 0
    fields = ("prefix", "name", "default_class", "created_at", "last_used_at", "revoked_at")
    readonly_fields = fields
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # keys are created on their own page, where the raw key is shown once


@admin.register(Tenant)
class TenantAdmin(AuditedAdmin[Tenant]):
    list_display = ("slug", "name", "is_active", "weight", "quota", "burst", "rpm_limit")
    list_filter = ("is_active", "budget_period")
    search_fields = ("slug", "name")
    prepopulated_fields = {"slug": ("name",)}
    readonly_fields = ("quota", "burst", "created_at", "updated_at")
    inlines = (ApiKeyInline,)
    fieldsets = (
        (None, {"fields": ("name", "slug", "is_active")}),
        (
            "Fair share and memory",
            {"fields": ("weight", "quota_units", "quota", "burst_units", "burst")},
        ),
        ("Access", {"fields": ("allowed_classes", "allowed_models")}),
        ("Limits", {"fields": ("rpm_limit", "tpm_limit", "token_budget", "budget_period")}),
        ("History", {"fields": ("created_at", "updated_at")}),
    )

    @admin.display(description="quota", ordering="quota_units")
    def quota(self, tenant: Tenant) -> str:
        return format_units(tenant.quota_units)

    @admin.display(description="burst", ordering="burst_units")
    def burst(self, tenant: Tenant) -> str:
        return format_units(tenant.burst_units)


@admin.register(ApiKey)
class ApiKeyAdmin(AuditedAdmin[ApiKey]):
    list_display = (
        "prefix",
        "name",
        "tenant",
        "default_class",
        "created_at",
        "last_used_at",
        "revoked",
    )
    list_filter = ("default_class", ("revoked_at", admin.EmptyFieldListFilter), "tenant")
    search_fields = ("prefix", "name", "tenant__slug", "tenant__name")
    list_select_related = ("tenant",)
    readonly_fields = ("prefix", "created_at", "last_used_at", "revoked_at")
    fields = (
        "tenant",
        "name",
        "default_class",
        "expires_at",
        "allowed_models",
        "rpm_limit",
        "tpm_limit",
        "prefix",
        "created_at",
        "last_used_at",
        "revoked_at",
    )
    actions = ("revoke_keys",)

    @admin.display(boolean=True, description="revoked")
    def revoked(self, api_key: ApiKey) -> bool:
        return api_key.is_revoked

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if not change:
            material = new_key_material()
            obj.prefix, obj.hashed_key = material.prefix, material.hashed_key
            messages.warning(
                request,
                f"New key for {obj.tenant.slug}: {material.raw_key} "
                "— copy it now, it is not shown again.",
            )
        super().save_model(request, obj, form, change)

    @admin.action(description="Revoke selected keys")
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = api_keys_revoke(api_keys=queryset)
        messages.success(request, f"Revoked {count} key(s).")


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin[UsageRecord]):
    """The ledger is written by the platform only: read-only here."""

    list_display = (
        "finished_at", "tenant", "model", "request_class", "outcome", "prompt_tokens",
        "completion_tokens", "queue_wait_ms", "latency_ms",
    )  # fmt: skip
    list_filter = ("outcome", "request_class", "model", "tenant")
    search_fields = ("request_id", "batch_id", "end_user", "tenant__slug")
    date_hierarchy = "finished_at"
    list_select_related = ("tenant",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin[Membership]):
    """People in tenants (the portal's); deleting one takes the person out of the tenant."""

    list_display = ("user", "tenant", "role", "created_at")
    list_filter = ("role", "tenant")
    search_fields = ("user__username", "user__email", "tenant__slug")
    list_select_related = ("user", "tenant")


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin[Invitation]):
    """Owners' invitations; the token is never shown again (only its hash is stored)."""

    list_display = ("email", "tenant", "role", "created_at", "expires_at", "accepted_at")
    list_filter = ("role", "tenant")
    search_fields = ("email", "tenant__slug")
    readonly_fields = ("tenant", "email", "role", "invited_by", "created_at", "accepted_at")
    exclude = ("hashed_token",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # an invitation's link is shown once, on the portal's People page
