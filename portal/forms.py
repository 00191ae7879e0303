"""The portal's forms: a new key, an invitation, a batch."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django import forms

from protocol.classes import REQUEST_CLASSES
from scheduler.batches.validation import ENDPOINTS_BY_PATH
from tenants.models import BudgetPeriod, MemberRole, Tenant


class KeyForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Who or what uses it, e.g. 'web backend'.")
    expires_at = forms.DateTimeField(
        required=False,
        label="Expires",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        help_text="UTC; empty: never.",
    )
    allowed_models = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Models",
        help_text="None ticked: every model the tenant may use.",
    )
    default_class = forms.ChoiceField(label="Default class")
    rpm_limit = forms.IntegerField(
        required=False, min_value=1, label="Requests per minute", help_text="Empty: the tenant's."
    )
    tpm_limit = forms.IntegerField(
        required=False, min_value=1, label="Tokens per minute", help_text="Empty: the tenant's."
    )
    # The key's own spending budget (billing.MoneyBudget), made with the key.
    budget_amount = forms.DecimalField(
        required=False,
        min_value=Decimal("0.01"),
        decimal_places=2,
        label="Spending budget",
        help_text="In the platform's currency, at its prices; empty: none of its own.",
    )
    budget_period = forms.ChoiceField(
        required=False, choices=BudgetPeriod.choices, initial=BudgetPeriod.MONTH,
        label="Budget period",
    )  # fmt: skip
    budget_hard_stop = forms.BooleanField(
        required=False,
        label="Stop the key at its budget",
        help_text="Refuse its calls once the period's spend reaches the budget; else alerts only.",
    )

    BUDGET_FIELDS = ("budget_amount", "budget_period", "budget_hard_stop")

    def __init__(self, *args: Any, tenant: Tenant, models: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        allowed = self.fields["allowed_models"]
        assert isinstance(allowed, forms.MultipleChoiceField)
        allowed.choices = [(m, m) for m in models if tenant.allows_model(m)]
        default_class = self.fields["default_class"]
        assert isinstance(default_class, forms.ChoiceField)
        default_class.choices = [(c, c) for c in REQUEST_CLASSES if tenant.allows_class(c)]

    def clean_expires_at(self) -> datetime | None:
        moment: datetime | None = self.cleaned_data.get("expires_at")
        if moment is not None and moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment


class InviteForm(forms.Form):
    email = forms.EmailField()
    role = forms.ChoiceField(choices=MemberRole.choices, initial=MemberRole.MEMBER)


class BatchForm(forms.Form):
    file = forms.FileField(label="Input file (JSONL)", help_text="One request a line, as OpenAI's.")
    endpoint = forms.ChoiceField(choices=[(p, p) for p in ENDPOINTS_BY_PATH])


class AcceptForm(forms.Form):
    """Accepting an invitation without single sign-on: a username and a password."""

    username = forms.CharField(max_length=150)
    password = forms.CharField(widget=forms.PasswordInput, min_length=8)
