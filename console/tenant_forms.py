"""Console forms for tenants and keys.

They only parse what a person typed into Python values; what is allowed (weight > 0, units
>= 0, known classes, unique slug) is decided by tenants.services and the model, whose
ValidationErrors `add_service_errors` puts next to the fields.
"""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.urls import reverse_lazy

from protocol.classes import REQUEST_CLASSES, RequestClass
from protocol.fields import OPTIONAL_FIELDS
from tenants.models import BudgetPeriod, Tenant

CLASS_CHOICES = [(name, name) for name in REQUEST_CLASSES]


def _units_input() -> forms.NumberInput:
    """A units field that shows '8 units = 2.0 GiB' beside it as the operator types (htmx)."""
    return forms.NumberInput(
        attrs={
            "hx-get": reverse_lazy("console:units-preview"),
            "hx-trigger": "load, input changed delay:250ms",
            "hx-target": "next .units-preview",
        }
    )


def add_service_errors(form: forms.Form, error: ValidationError) -> None:
    """Show a service's ValidationError next to the fields it names (others on top)."""
    if not hasattr(error, "error_dict"):
        form.add_error(None, error)
        return
    for field, messages in error.message_dict.items():
        form.add_error(field if field in form.fields else None, messages)


class TenantForm(forms.Form):
    """The fields an operator edits; `TenantCreateForm` adds the slug."""

    name = forms.CharField(max_length=200, required=False)
    is_active = forms.BooleanField(label="Active", required=False)
    weight = forms.FloatField(help_text="Share of contended capacity relative to others (> 0).")
    quota_units = forms.IntegerField(
        label="Quota (units)",
        widget=_units_input(),
        help_text="Guaranteed GPU memory held at once, in 256 MiB units (8 units = 2.0 GiB).",
    )
    burst_units = forms.IntegerField(
        label="Burst (units)",
        widget=_units_input(),
        help_text="Units it may borrow above quota while others idle.",
    )
    allowed_classes = forms.MultipleChoiceField(
        label="Allowed classes",
        choices=CLASS_CHOICES,
        required=False,
        widget=forms.CheckboxSelectMultiple,
    )
    allowed_models = forms.CharField(
        label="Allowed models",
        required=False,
        help_text="Served model names, separated by commas or spaces; empty = all.",
    )
    rpm_limit = forms.IntegerField(label="Requests per minute", required=False)
    tpm_limit = forms.IntegerField(label="Tokens per minute", required=False)
    token_budget = forms.IntegerField(label="Token budget", required=False)
    budget_period = forms.ChoiceField(label="Budget period", choices=BudgetPeriod.choices)
    enabled_fields = forms.MultipleChoiceField(
        label="Extra request fields",
        choices=[(name, name) for name in OPTIONAL_FIELDS],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Each costs the shared engine work outside the tenant's KV reservation.",
    )
    cache_group = forms.SlugField(
        label="Prefix-cache group",
        max_length=64,
        required=False,
        help_text="Tenants of one group share cached prompt prefixes; empty = its own cache.",
    )

    def clean_allowed_models(self) -> list[str]:
        return [name for name in re.split(r"[,\s]+", self.cleaned_data["allowed_models"]) if name]

    @staticmethod
    def initial_for(tenant: Tenant) -> dict[str, Any]:
        return {
            "name": tenant.name,
            "is_active": tenant.is_active,
            "weight": tenant.weight,
            "quota_units": tenant.quota_units,
            "burst_units": tenant.burst_units,
            "allowed_classes": tenant.allowed_classes,
            "allowed_models": ", ".join(tenant.allowed_models),
            "rpm_limit": tenant.rpm_limit,
            "tpm_limit": tenant.tpm_limit,
            "token_budget": tenant.token_budget,
            "budget_period": tenant.budget_period,
            "cache_group": tenant.cache_group,
            "enabled_fields": tenant.enabled_fields,
        }


class TenantCreateForm(TenantForm):
    slug = forms.CharField(max_length=64, help_text="Lowercase letters, digits and dashes.")
    # tenant_create makes active tenants; deactivating is an edit.
    is_active = None  # type: ignore[assignment]

    field_order = ("slug", "name")

    @staticmethod
    def defaults() -> dict[str, Any]:
        return {
            "weight": 1.0,
            "quota_units": 0,
            "burst_units": 0,
            "allowed_classes": list(settings.GPUSHARE_DEFAULT_CLASSES),
            "budget_period": BudgetPeriod.MONTH,
        }


class ApiKeyCreateForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Who or what uses it, e.g. 'web backend'.")
    default_class = forms.ChoiceField(
        label="Default class", choices=CLASS_CHOICES, initial=RequestClass.STANDARD.value
    )
