"""Who uses the platform: tenants, their quotas and weights, and their API keys."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from capacity.units import format_units
from protocol.classes import REQUEST_CLASSES, RequestClass, unknown_classes
from protocol.fields import MAX_USER_CHARS, OPTIONAL_FIELDS


def _all_classes() -> list[str]:
    """The default of the field: the operator's default classes (GPUSHARE_DEFAULT_CLASSES).
    (Migrations refer to the function by this name, so it keeps it although the default
    need not be every class.)"""
    return list(settings.GPUSHARE_DEFAULT_CLASSES)


def _no_models() -> list[str]:
    return []


class BudgetPeriod(models.TextChoices):
    DAY = "day", "day"
    MONTH = "month", "month"


class Tenant(models.Model):
    """A team or customer. Its quota is GPU memory in 256 MiB units that it may hold at once."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    is_active = models.BooleanField(default=True)
    weight = models.FloatField(
        default=1.0, help_text="Share of contended capacity relative to other tenants (> 0)."
    )
    quota_units = models.PositiveIntegerField(
        default=0,
        help_text="Guaranteed GPU memory it may hold at once, in 256 MiB units.",
    )
    burst_units = models.PositiveIntegerField(
        default=0,
        help_text="Units it may borrow above its quota while others leave capacity idle.",
    )
    allowed_classes = models.JSONField(
        default=_all_classes, help_text="Request classes its keys may use."
    )
    allowed_models = models.JSONField(
        default=_no_models, blank=True, help_text="Served model names it may use; empty = all."
    )
    rpm_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text="Requests per minute; empty = unlimited."
    )
    tpm_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text="Tokens per minute; empty = unlimited."
    )
    token_budget = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Tokens per budget period, batch work included."
    )
    budget_period = models.CharField(
        max_length=8, choices=BudgetPeriod.choices, default=BudgetPeriod.MONTH
    )
    enabled_fields = models.JSONField(
        default=list,
        blank=True,
        help_text=(
            "Request fields beyond the standard ones it may send, each a cost to the shared "
            "engine: prompt_logprobs, structured_outputs, chat_template_kwargs."
        ),
    )
    cache_group = models.SlugField(
        max_length=64,
        blank=True,
        default="",
        help_text=(
            "Tenants of one group share cached prompt prefixes on the engines (and can tell "
            "from the time to a first token what another sent); empty = its own cache."
        ),
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("slug",)
        constraints = (
            models.CheckConstraint(condition=Q(weight__gt=0), name="tenant_weight_positive"),
        )

    def __str__(self) -> str:
        return self.slug

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.weight is not None and self.weight <= 0:
            errors["weight"] = f"Weight must be greater than 0, got {self.weight:g}."
        errors.update(_list_errors("allowed_classes", self.allowed_classes))
        errors.update(_list_errors("allowed_models", self.allowed_models))
        errors.update(_list_errors("enabled_fields", self.enabled_fields))
        if "enabled_fields" not in errors:
            unknown = sorted(set(self.enabled_fields) - set(OPTIONAL_FIELDS))
            if unknown:
                errors["enabled_fields"] = (
                    f"Unknown field {', '.join(map(repr, unknown))}; choose from "
                    f"{', '.join(OPTIONAL_FIELDS)}."
                )
        if "allowed_classes" not in errors:
            unknown = unknown_classes(self.allowed_classes)
            if unknown:
                errors["allowed_classes"] = (
                    f"Unknown request class {', '.join(map(repr, unknown))}; "
                    f"choose from {', '.join(REQUEST_CLASSES)}."
                )
            elif not self.allowed_classes:
                errors["allowed_classes"] = "A tenant must be allowed at least one class."
        if errors:
            raise ValidationError(errors)

    @property
    def quota_display(self) -> str:
        return format_units(self.quota_units)

    @property
    def burst_display(self) -> str:
        return format_units(self.burst_units)

    def allows_class(self, request_class: str) -> bool:
        return request_class in self.allowed_classes

    def allows_model(self, served_model_name: str) -> bool:
        return not self.allowed_models or served_model_name in self.allowed_models


def _list_errors(field: str, value: object) -> dict[str, str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        return {field: "Must be a list of names."}
    return {}


class ApiKey(models.Model):
    """A tenant's credential for the OpenAI-compatible API. Only its SHA-256 is stored.

    A key is 256 random bits, so a fast hash is enough: nobody can brute-force the preimage,
    and a fast hash lets every request look its key up by an index.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(
        max_length=16, help_text="The key's first characters, to recognise it; not a secret."
    )
    hashed_key = models.CharField(max_length=64, unique=True, editable=False)
    default_class = models.CharField(
        max_length=16,
        choices=[(c.value, c.value) for c in RequestClass],
        default=RequestClass.STANDARD.value,
    )
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="When the key stops working; empty = never."
    )
    allowed_models = models.JSONField(
        default=_no_models,
        blank=True,
        help_text="Served model names this key may use, within its tenant's; empty = the tenant's.",
    )
    rpm_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text="Requests per minute of this key; empty = the tenant's."
    )
    tpm_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text="Tokens per minute of this key; empty = the tenant's."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("tenant__slug", "-created_at")
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name})"

    def clean(self) -> None:
        errors = _list_errors("allowed_models", self.allowed_models)
        if not errors and self.tenant_id is not None and self.tenant.allowed_models:
            outside = sorted(set(self.allowed_models) - set(self.tenant.allowed_models))
            if outside:
                errors["allowed_models"] = (
                    f"Tenant '{self.tenant.slug}' may not use {', '.join(map(repr, outside))}."
                )
        if errors:
            raise ValidationError(errors)

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    def is_expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    def allows_model(self, served_model_name: str) -> bool:
        """Within its tenant's models, and its own list where it has one."""
        return self.tenant.allows_model(served_model_name) and (
            not self.allowed_models or served_model_name in self.allowed_models
        )

    @property
    def has_limits(self) -> bool:
        return bool(self.rpm_limit or self.tpm_limit)


class MemberRole(models.TextChoices):
    """What a person may do in a tenant's portal: an owner also invites people; a member
    also makes and revokes keys and runs batches; a viewer reads."""

    OWNER = "owner", "owner"
    MEMBER = "member", "member"
    VIEWER = "viewer", "viewer"


class Membership(models.Model):
    """A person (a Django user, signed in through SSO or an invitation) in a tenant."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=8, choices=MemberRole.choices, default=MemberRole.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("tenant__slug", "user__username")
        constraints = (models.UniqueConstraint(fields=("user", "tenant"), name="membership_once"),)

    def __str__(self) -> str:
        return f"{self.user_id} in {self.tenant_id} ({self.role})"

    @property
    def can_write(self) -> bool:
        return self.role in (MemberRole.OWNER, MemberRole.MEMBER)

    @property
    def can_invite(self) -> bool:
        return self.role == MemberRole.OWNER


class Invitation(models.Model):
    """An owner's invitation of an email address into a tenant. Only the token's SHA-256 is
    stored; the link with the token is shown once. Signing in through SSO with the invited
    address accepts it too."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=8, choices=MemberRole.choices, default=MemberRole.MEMBER)
    hashed_token = models.CharField(max_length=64, unique=True, editable=False)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created_at",)

    def __str__(self) -> str:
        return f"{self.email} to {self.tenant_id} ({self.role})"

    def is_open(self, now: datetime) -> bool:
        return self.accepted_at is None and self.expires_at > now


class Outcome(models.TextChoices):
    SUCCESS = "success", "success"
    ERROR = "error", "error"  # the engine failed or answered an error
    CANCELLED = "cancelled", "cancelled"  # the client went away or cancelled
    TIMEOUT = "timeout", "timeout"  # waited past its class's queue timeout
    REJECTED = "rejected", "rejected"  # refused before queueing (429 / 403 / never fits)


class UsageRecord(models.Model):
    """One finished request: the ledger that quota reports and `/v1/usage` are built from.

    `request_id` is the scheduler's job id and is unique, so writing the same result twice
    (a retried task, a job run twice after a lost lease) keeps one row.
    """

    request_id = models.CharField(max_length=64, unique=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="usage")
    api_key = models.ForeignKey(
        ApiKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="usage"
    )
    model = models.CharField(max_length=200)
    engine = models.CharField(max_length=100, blank=True)
    request_class = models.CharField(
        max_length=16, choices=[(c.value, c.value) for c in RequestClass]
    )
    batch_id = models.CharField(max_length=64, blank=True, db_index=True)
    endpoint = models.CharField(max_length=64, blank=True)
    end_user = models.CharField(
        max_length=MAX_USER_CHARS,
        blank=True,
        help_text="The end user the request named (OpenAI's `user`); '' when none.",
    )
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    status_code = models.PositiveSmallIntegerField(default=200)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(
        default=0, help_text="Of its prompt tokens, those the engine's prefix cache held."
    )
    reserved_units = models.FloatField(default=0, help_text="KV reservation held, in units.")
    reserved_unit_seconds = models.FloatField(default=0)
    queue_wait_ms = models.PositiveIntegerField(default=0)
    ttft_ms = models.PositiveIntegerField(null=True, blank=True)
    latency_ms = models.PositiveIntegerField(default=0)
    error_code = models.CharField(max_length=64, blank=True)
    requests = models.PositiveIntegerField(
        default=1,
        help_text=(
            "Requests the row stands for: 1, or the refused requests of one key, reason, class "
            "and second, so that a flood of refusals costs the ledger one row a second."
        ),
    )
    finished_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ("-finished_at",)
        indexes = (models.Index(fields=("tenant", "finished_at"), name="usage_tenant_time"),)

    def __str__(self) -> str:
        return f"{self.request_id} {self.tenant_id} {self.outcome}"

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens
