"""Money: prices per served model, money budgets per tenant and per key, and the alerts a
budget has sent. Spend itself is not stored: it is computed from the usage ledger
(`billing.selectors`)."""

from __future__ import annotations

from decimal import Decimal

from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from tenants.models import ApiKey, BudgetPeriod, Tenant

# Prices and amounts: up to 10^8 with six places, enough for a thousandth of a cent per
# million tokens and for a large monthly budget.
MONEY_DIGITS, MONEY_PLACES = 14, 6
ANY_MODEL = "*"


def _money(**options: object) -> models.DecimalField:
    return models.DecimalField(
        max_digits=MONEY_DIGITS,
        decimal_places=MONEY_PLACES,
        validators=[MinValueValidator(Decimal(0))],
        **options,  # type: ignore[arg-type]
    )


class Price(models.Model):
    """What a served model costs from `effective_from` (a whole hour, UTC) until the next
    version of its price: per million input (prompt) tokens, per million output (completion)
    tokens, and per unit-hour of KV reservation held (256 MiB for an hour). Versions are kept,
    so a price change leaves earlier spend as it was charged. `*` prices every model that
    has no price of its own."""

    model = models.CharField(max_length=200, help_text="Served model name, or * for any other.")
    input_per_million = _money(default=Decimal(0))
    output_per_million = _money(default=Decimal(0))
    unit_hour = _money(default=Decimal(0), help_text="Per 256 MiB unit of KV held for an hour.")
    effective_from = models.DateTimeField(db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("model", "-effective_from")
        constraints = (
            models.UniqueConstraint(fields=("model", "effective_from"), name="price_version"),
        )

    def __str__(self) -> str:
        return f"{self.model} from {self.effective_from:%Y-%m-%d %H:%M}"


class MoneyBudget(models.Model):
    """A budget in money for a tenant (no key) or one of its keys, per day or month. The
    budget check (`billing.alerts`) alerts at 50, 80 and 100 % of it, once each per period,
    by email and webhook; with `hard_stop`, a spend at or over the amount refuses the
    tenant's (or key's) requests until the period ends (`exhausted_until`)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="money_budgets")
    api_key = models.ForeignKey(
        ApiKey, on_delete=models.CASCADE, null=True, blank=True, related_name="money_budgets"
    )
    amount = models.DecimalField(
        max_digits=MONEY_DIGITS,
        decimal_places=MONEY_PLACES,
        validators=[MinValueValidator(Decimal("0.000001"))],
    )
    period = models.CharField(
        max_length=8, choices=BudgetPeriod.choices, default=BudgetPeriod.MONTH
    )
    hard_stop = models.BooleanField(default=False)
    alert_emails = models.JSONField(default=list, blank=True, help_text="Addresses to alert.")
    webhook_url = models.URLField(blank=True, max_length=500)
    exhausted_until = models.DateTimeField(
        null=True, blank=True, help_text="Set by the budget check while the period's spend is over."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("tenant__slug", "api_key_id")
        constraints = (
            models.UniqueConstraint(
                fields=("tenant",), condition=Q(api_key__isnull=True), name="money_budget_tenant"
            ),
            models.UniqueConstraint(
                fields=("api_key",), condition=Q(api_key__isnull=False), name="money_budget_key"
            ),
        )

    def __str__(self) -> str:
        scope = f"key {self.api_key_id}" if self.api_key_id else "tenant"
        return f"{self.tenant} ({scope}): {self.amount} per {self.period}"


class BudgetAlert(models.Model):
    """A threshold a budget crossed in one period: written once (its unique constraint makes
    the alert fire once however many workers check), with what was sent."""

    budget = models.ForeignKey(MoneyBudget, on_delete=models.CASCADE, related_name="alerts")
    period_start = models.DateTimeField()
    threshold = models.PositiveSmallIntegerField(help_text="Percent of the amount.")
    spend = models.DecimalField(max_digits=MONEY_DIGITS, decimal_places=MONEY_PLACES)
    fired_at = models.DateTimeField(auto_now_add=True)
    emailed = models.BooleanField(default=False)
    webhook_status = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ("-fired_at",)
        constraints = (
            models.UniqueConstraint(
                fields=("budget", "period_start", "threshold"), name="budget_alert_once"
            ),
        )

    def __str__(self) -> str:
        return f"{self.budget}: {self.threshold}% at {self.period_start:%Y-%m-%d}"
