"""`manage.py tenant create|list|show|update`: operators manage tenants from a shell."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError, CommandParser

from audit.commands import AuditedCommand
from capacity.units import format_units
from plumbing.errors import DomainError
from protocol.classes import REQUEST_CLASSES
from protocol.fields import OPTIONAL_FIELDS
from tenants import selectors, services
from tenants.management.output import print_json, print_table
from tenants.models import BudgetPeriod, Tenant


def tenant_as_dict(tenant: Tenant) -> dict[str, Any]:
    return {
        "slug": tenant.slug,
        "name": tenant.name,
        "is_active": tenant.is_active,
        "weight": tenant.weight,
        "quota_units": tenant.quota_units,
        "burst_units": tenant.burst_units,
        "quota": format_units(tenant.quota_units),
        "allowed_classes": tenant.allowed_classes,
        "allowed_models": tenant.allowed_models,
        "rpm_limit": tenant.rpm_limit,
        "tpm_limit": tenant.tpm_limit,
        "token_budget": tenant.token_budget,
        "budget_period": tenant.budget_period,
    }


def validation_message(exc: ValidationError) -> str:
    if hasattr(exc, "error_dict"):
        return "; ".join(
            f"{field}: {' '.join(messages)}" for field, messages in exc.message_dict.items()
        )
    return " ".join(exc.messages)


def _add_policy_arguments(parser: CommandParser, *, creating: bool) -> None:
    parser.add_argument("--name", help="Display name (default: the slug).")
    parser.add_argument("--weight", type=float, help="Fair-share weight, > 0 (default 1).")
    parser.add_argument(
        "--quota-units", type=int, required=creating, help="Guaranteed memory, 256 MiB units."
    )
    parser.add_argument("--burst-units", type=int, help="Units it may borrow above its quota.")
    parser.add_argument(
        "--classes",
        nargs="+",
        metavar="CLASS",
        help=f"Allowed classes: {', '.join(REQUEST_CLASSES)}.",
    )
    parser.add_argument(
        "--models", nargs="*", metavar="MODEL", help="Allowed served models (none = all)."
    )
    parser.add_argument("--rpm", type=int, help="Requests per minute limit (0 = none).")
    parser.add_argument("--tpm", type=int, help="Tokens per minute limit (0 = none).")
    parser.add_argument("--token-budget", type=int, help="Tokens per period (0 = none).")
    parser.add_argument("--budget-period", choices=BudgetPeriod.values)
    parser.add_argument(
        "--enable-fields",
        nargs="*",
        metavar="FIELD",
        help=f"Extra request fields it may send: {', '.join(OPTIONAL_FIELDS)} (none = none).",
    )
    parser.add_argument(
        "--cache-group",
        help="Share cached prompt prefixes with the tenants of this group ('' = its own).",
    )


def _policy_changes(options: dict[str, Any]) -> dict[str, Any]:
    """The options the operator gave, as Tenant fields. 0 clears an optional limit."""
    mapping = {
        "name": "name",
        "weight": "weight",
        "quota_units": "quota_units",
        "burst_units": "burst_units",
        "classes": "allowed_classes",
        "models": "allowed_models",
        "budget_period": "budget_period",
        "cache_group": "cache_group",
        "enable_fields": "enabled_fields",
    }
    changes = {
        field: options[opt] for opt, field in mapping.items() if options.get(opt) is not None
    }
    limits = {"rpm": "rpm_limit", "tpm": "tpm_limit", "token_budget": "token_budget"}
    for opt, field in limits.items():
        if options.get(opt) is not None:
            changes[field] = options[opt] or None
    return changes


class Command(AuditedCommand):
    help = "Create, list, show and update tenants."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        create = actions.add_parser("create", help="Create a tenant and its first API key.")
        create.add_argument("slug")
        _add_policy_arguments(create, creating=True)
        create.add_argument("--key-name", default="default", help="Name of the first key.")
        create.add_argument("--no-key", action="store_true", help="Create no key.")
        update = actions.add_parser("update", help="Change a tenant's quota, weight or limits.")
        update.add_argument("slug")
        _add_policy_arguments(update, creating=False)
        active = update.add_mutually_exclusive_group()
        active.add_argument("--activate", dest="is_active", action="store_const", const=True)
        active.add_argument("--deactivate", dest="is_active", action="store_const", const=False)
        listing = actions.add_parser("list", help="List tenants.")
        listing.add_argument("--active-only", action="store_true")
        show = actions.add_parser("show", help="Show one tenant.")
        show.add_argument("slug")
        for sub in (create, update, listing, show):
            sub.add_argument("--json", action="store_true", help="Print JSON for scripts.")
            sub.formatter_class = argparse.ArgumentDefaultsHelpFormatter

    def handle(self, *args: Any, **options: Any) -> None:
        handler = getattr(self, f"_{options['action']}")
        try:
            handler(options)
        except ValidationError as exc:
            raise CommandError(validation_message(exc)) from exc
        except DomainError as exc:
            raise CommandError(exc.message) from exc

    def _create(self, options: dict[str, Any]) -> None:
        tenant = services.tenant_create(slug=options["slug"], **_policy_changes(options))
        issued = None
        if not options["no_key"]:
            issued = services.api_key_create(tenant=tenant, name=options["key_name"])
        if options["json"]:
            data = tenant_as_dict(tenant)
            if issued:
                data["api_key"] = {
                    "id": issued.api_key.pk,
                    "name": issued.api_key.name,
                    "key": issued.raw_key,
                }
            print_json(self.stdout, data)
            return
        self.stdout.write(self.style.SUCCESS(f"Created tenant {tenant.slug}."))
        self._describe(tenant)
        if issued:
            self.stdout.write(f"\nAPI key '{issued.api_key.name}' (id {issued.api_key.pk}):")
            self.stdout.write(f"  {issued.raw_key}")
            self.stdout.write(self.style.WARNING("Store it now: it is not shown again."))

    def _update(self, options: dict[str, Any]) -> None:
        tenant = selectors.tenant_get(slug=options["slug"])
        changes = _policy_changes(options)
        if options.get("is_active") is not None:
            changes["is_active"] = options["is_active"]
        if not changes:
            raise CommandError("Nothing to change: give at least one option (see --help).")
        tenant = services.tenant_update(tenant=tenant, **changes)
        if options["json"]:
            print_json(self.stdout, tenant_as_dict(tenant))
            return
        self.stdout.write(
            self.style.SUCCESS(f"Updated tenant {tenant.slug}: {', '.join(sorted(changes))}.")
        )
        self._describe(tenant)

    def _list(self, options: dict[str, Any]) -> None:
        tenants = list(selectors.tenant_list(is_active=True if options["active_only"] else None))
        if options["json"]:
            print_json(self.stdout, [tenant_as_dict(t) for t in tenants])
            return
        columns = ("slug", "active", "weight", "quota", "burst units", "classes", "models")
        rows = [
            (
                t.slug,
                "yes" if t.is_active else "no",
                t.weight,
                format_units(t.quota_units),
                t.burst_units,
                t.allowed_classes,
                t.allowed_models,
            )
            for t in tenants
        ]
        print_table(self.stdout, columns, rows)

    def _show(self, options: dict[str, Any]) -> None:
        tenant = selectors.tenant_get(slug=options["slug"])
        if options["json"]:
            print_json(self.stdout, tenant_as_dict(tenant))
            return
        self._describe(tenant)

    def _describe(self, tenant: Tenant) -> None:
        for field, value in tenant_as_dict(tenant).items():
            shown = (
                value
                if value not in (None, [])
                else ("(all)" if field == "allowed_models" else "-")
            )
            if isinstance(shown, list):
                shown = ", ".join(shown)
            self.stdout.write(f"  {field:<16} {shown}")
