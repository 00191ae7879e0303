"""`manage.py budget set|show|list|delete`: money budgets per tenant or key, their alerts and
hard stop."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from audit.commands import AuditedCommand
from billing import selectors as billing
from billing import services
from billing.alerts import budgets_check
from billing.models import MoneyBudget
from plumbing.errors import DomainError
from tenants import selectors
from tenants.management.output import print_json, print_table
from tenants.models import BudgetPeriod


def budget_as_dict(budget: MoneyBudget) -> dict[str, Any]:
    return {
        "tenant": budget.tenant.slug,
        "api_key": budget.api_key_id,
        "amount": str(budget.amount),
        "currency": billing.currency(),
        "period": budget.period,
        "hard_stop": budget.hard_stop,
        "alert_emails": budget.alert_emails,
        "webhook_url": budget.webhook_url,
        "exhausted_until": budget.exhausted_until.isoformat() if budget.exhausted_until else None,
    }


class Command(AuditedCommand):
    help = "Set, show, list and delete money budgets; `check` runs the budget check now."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        setting = actions.add_parser("set", help="Create or change a budget.")
        setting.add_argument("tenant")
        setting.add_argument("--key", type=int, help="A key's budget instead of the tenant's.")
        setting.add_argument("--amount")
        setting.add_argument("--period", choices=BudgetPeriod.values)
        stop = setting.add_mutually_exclusive_group()
        stop.add_argument("--hard-stop", dest="hard_stop", action="store_true", default=None)
        stop.add_argument("--no-hard-stop", dest="hard_stop", action="store_false")
        setting.add_argument(
            "--email",
            dest="alert_emails",
            action="append",
            help="An address to alert (repeat it); --email '' for none.",
        )
        setting.add_argument("--webhook", dest="webhook_url", help="URL to POST alerts to.")
        show = actions.add_parser("show")
        show.add_argument("tenant")
        show.add_argument("--key", type=int)
        delete = actions.add_parser("delete")
        delete.add_argument("tenant")
        delete.add_argument("--key", type=int)
        listing = actions.add_parser("list")
        check = actions.add_parser("check", help="Check every budget now (alerts, stops).")
        for sub in (setting, show, delete, listing, check):
            sub.add_argument("--json", action="store_true", help="Print JSON for scripts.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            getattr(self, f"_{options['action']}")(options)
        except DomainError as exc:
            raise CommandError(exc.message) from exc

    def _scope(self, options: dict[str, Any]) -> dict[str, Any]:
        tenant = selectors.tenant_get(slug=options["tenant"])
        key = options.get("key")
        return {
            "tenant": tenant,
            "api_key": selectors.api_key_get(tenant=tenant, key_id=key) if key else None,
        }

    def _show_one(self, budget: MoneyBudget, options: dict[str, Any]) -> None:
        if options["json"]:
            print_json(self.stdout, budget_as_dict(budget))
            return
        for name, value in budget_as_dict(budget).items():
            self.stdout.write(f"{name}: {value}")

    def _set(self, options: dict[str, Any]) -> None:
        fields = {
            name: options[name]
            for name in ("amount", "period", "hard_stop", "webhook_url")
            if options[name] is not None
        }
        if options["alert_emails"] is not None:
            fields["alert_emails"] = [e for e in options["alert_emails"] if e]
        budget = services.budget_set(**self._scope(options), **fields)
        self._show_one(budget, options)

    def _show(self, options: dict[str, Any]) -> None:
        self._show_one(billing.budget_get(**self._scope(options)), options)

    def _delete(self, options: dict[str, Any]) -> None:
        services.budget_delete(budget=billing.budget_get(**self._scope(options)))
        self.stdout.write(self.style.SUCCESS("Budget deleted."))

    def _list(self, options: dict[str, Any]) -> None:
        budgets = list(billing.budget_list())
        if options["json"]:
            print_json(self.stdout, [budget_as_dict(b) for b in budgets])
            return
        print_table(
            self.stdout,
            ("tenant", "key", f"amount ({billing.currency()})", "period", "hard stop", "stopped"),
            [
                (
                    b.tenant.slug,
                    b.api_key_id,
                    b.amount,
                    b.period,
                    b.hard_stop,
                    b.exhausted_until.strftime("%Y-%m-%d %H:%M") if b.exhausted_until else None,
                )
                for b in budgets
            ],
        )

    def _check(self, options: dict[str, Any]) -> None:
        crossings = budgets_check()
        rows = [
            {
                "tenant": c.budget.tenant.slug,
                "api_key": c.budget.api_key_id,
                "thresholds": c.thresholds,
                "spend": str(c.spent),
            }
            for c in crossings
        ]
        if options["json"]:
            print_json(self.stdout, rows)
            return
        for row in rows:
            self.stdout.write(
                f"{row['tenant']} key={row['api_key']}: {row['thresholds']}% (spend {row['spend']})"
            )
        self.stdout.write(f"{len(rows)} budget(s) alerted.")
