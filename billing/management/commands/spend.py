"""`manage.py spend --tenant acme --period day [--group-by model] [--csv|--json]`: what a
tenant spent, from the usage ledger at the prices in effect."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from billing import selectors as billing
from plumbing.errors import DomainError
from tenants import reports, selectors
from tenants.management.output import print_json, print_table


class Command(BaseCommand):
    help = "A tenant's spend over the current hour/day/month or a range."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="Tenant slug.")
        parser.add_argument("--period", choices=reports.PERIODS, default="month")
        parser.add_argument("--since", type=datetime.fromisoformat, help="ISO 8601 start.")
        parser.add_argument("--until", type=datetime.fromisoformat, help="ISO 8601 end.")
        parser.add_argument("--group-by", choices=billing.GROUPINGS)
        parser.add_argument("--key", type=int, help="Only this API key's spend.")
        out = parser.add_mutually_exclusive_group()
        out.add_argument("--json", action="store_true")
        out.add_argument("--csv", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            tenant = selectors.tenant_get(slug=options["tenant"])
            api_key = (
                selectors.api_key_get(tenant=tenant, key_id=options["key"])
                if options["key"] is not None
                else None
            )
            since, until = reports.report_range(
                since=options["since"], until=options["until"], period=options["period"]
            )
            rows = billing.spend(tenant, since, until, options["group_by"], api_key=api_key)
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        if options["csv"]:
            self.stdout.write(billing.spend_csv(rows, group_by=options["group_by"]), ending="")
            return
        if options["json"]:
            print_json(self.stdout, [r.as_dict() for r in rows])
            return
        self.stdout.write(f"{tenant.slug}: {since:%Y-%m-%d %H:%M} to {until:%Y-%m-%d %H:%M} UTC")
        print_table(
            self.stdout,
            (
                options["group_by"] or "group",
                "requests",
                "prompt",
                "completion",
                "unit-hours",
                f"money ({billing.currency()})",
            ),
            [
                (
                    d["group"] or "total",
                    d["requests"],
                    d["prompt_tokens"],
                    d["completion_tokens"],
                    d["unit_hours"],
                    d["money"],
                )
                for d in (r.as_dict() for r in rows)
            ],
        )
