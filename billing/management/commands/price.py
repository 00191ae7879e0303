"""`manage.py price set|list|history|delete`: staff set what each served model costs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.management.base import CommandError, CommandParser

from audit.commands import AuditedCommand
from billing import selectors, services
from billing.models import Price
from plumbing.errors import DomainError
from tenants.management.output import print_json, print_table


def price_as_dict(price: Price) -> dict[str, Any]:
    return {
        "model": price.model,
        "input_per_million": str(price.input_per_million),
        "output_per_million": str(price.output_per_million),
        "unit_hour": str(price.unit_hour),
        "currency": selectors.currency(),
        "effective_from": price.effective_from.isoformat(),
    }


class Command(AuditedCommand):
    help = "Set, list and delete prices per served model (per million tokens, per unit-hour)."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        setting = actions.add_parser("set", help="A model's price from this hour (or --from).")
        setting.add_argument("model", help="Served model name, or '*' for any other model.")
        setting.add_argument(
            "--input",
            dest="input_per_million",
            default="0",
            help="Per million input (prompt) tokens.",
        )
        setting.add_argument(
            "--output",
            dest="output_per_million",
            default="0",
            help="Per million output (completion) tokens.",
        )
        setting.add_argument(
            "--unit-hour",
            dest="unit_hour",
            default="0",
            help="Per 256 MiB unit of KV held for an hour.",
        )
        setting.add_argument(
            "--from",
            dest="effective_from",
            type=datetime.fromisoformat,
            help="ISO 8601 hour it applies from (default: this hour).",
        )
        listing = actions.add_parser("list", help="The prices in effect now.")
        history = actions.add_parser("history", help="Every version of a model's price.")
        history.add_argument("model")
        delete = actions.add_parser("delete", help="Remove every version of a model's price.")
        delete.add_argument("model")
        for sub in (setting, listing, history, delete):
            sub.add_argument("--json", action="store_true", help="Print JSON for scripts.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            getattr(self, f"_{options['action']}")(options)
        except DomainError as exc:
            raise CommandError(exc.message) from exc

    def _set(self, options: dict[str, Any]) -> None:
        price = services.price_set(
            model=options["model"],
            input_per_million=options["input_per_million"],
            output_per_million=options["output_per_million"],
            unit_hour=options["unit_hour"],
            effective_from=options["effective_from"],
        )
        if options["json"]:
            print_json(self.stdout, price_as_dict(price))
            return
        self.stdout.write(
            self.style.SUCCESS(
                f"Price of {price.model} set from {price.effective_from:%Y-%m-%d %H:00} UTC."
            )
        )

    def _print(self, prices: list[Price], options: dict[str, Any]) -> None:
        if options["json"]:
            print_json(self.stdout, [price_as_dict(p) for p in prices])
            return
        unit = selectors.currency()
        print_table(
            self.stdout,
            ("model", f"input/M ({unit})", f"output/M ({unit})", f"unit-hour ({unit})", "from"),
            [
                (
                    p.model,
                    p.input_per_million,
                    p.output_per_million,
                    p.unit_hour,
                    p.effective_from.strftime("%Y-%m-%d %H:%M"),
                )
                for p in prices
            ],
        )

    def _list(self, options: dict[str, Any]) -> None:
        self._print(selectors.price_list(), options)

    def _history(self, options: dict[str, Any]) -> None:
        self._print(list(selectors.price_history(model=options["model"])), options)

    def _delete(self, options: dict[str, Any]) -> None:
        count = services.price_delete(model=options["model"])
        self.stdout.write(self.style.SUCCESS(f"Deleted {count} version(s) of {options['model']}."))
