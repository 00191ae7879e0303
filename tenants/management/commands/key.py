"""`manage.py key create|revoke|list`: operators manage tenants' API keys."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError, CommandParser

from audit.commands import AuditedCommand
from plumbing.errors import DomainError
from protocol.classes import REQUEST_CLASSES, RequestClass
from tenants import selectors, services
from tenants.management.commands.tenant import validation_message
from tenants.management.output import print_json, print_table
from tenants.models import ApiKey


def key_as_dict(api_key: ApiKey) -> dict[str, Any]:
    return {
        "id": api_key.pk,
        "tenant": api_key.tenant.slug,
        "name": api_key.name,
        "prefix": api_key.prefix,
        "default_class": api_key.default_class,
        "expires_at": api_key.expires_at.isoformat() if api_key.expires_at else None,
        "allowed_models": api_key.allowed_models,
        "rpm_limit": api_key.rpm_limit,
        "tpm_limit": api_key.tpm_limit,
        "created_at": api_key.created_at.isoformat(),
        "last_used_at": api_key.last_used_at.isoformat() if api_key.last_used_at else None,
        "revoked_at": api_key.revoked_at.isoformat() if api_key.revoked_at else None,
    }


def _moment(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time.") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


class Command(AuditedCommand):
    help = "Create, revoke and list tenants' API keys."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        create = actions.add_parser("create", help="Create a key; prints it once.")
        create.add_argument("tenant", help="Tenant slug.")
        create.add_argument("--name", default="default")
        create.add_argument(
            "--class",
            dest="default_class",
            choices=REQUEST_CLASSES,
            default=RequestClass.STANDARD.value,
        )
        create.add_argument(
            "--expires", type=_moment, help="When it stops working (ISO 8601; UTC if naive)."
        )
        create.add_argument(
            "--models", nargs="+", default=[], help="Models it may use, within its tenant's."
        )
        create.add_argument("--rpm", type=int, help="Requests per minute of this key.")
        create.add_argument("--tpm", type=int, help="Tokens per minute of this key.")
        revoke = actions.add_parser("revoke", help="Revoke a key.")
        revoke.add_argument("tenant", help="Tenant slug.")
        revoke.add_argument("key_id", type=int)
        listing = actions.add_parser("list", help="List a tenant's keys.")
        listing.add_argument("tenant", help="Tenant slug.")
        for sub in (create, revoke, listing):
            sub.add_argument("--json", action="store_true", help="Print JSON for scripts.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            tenant = selectors.tenant_get(slug=options["tenant"])
            getattr(self, f"_{options['action']}")(tenant, options)
        except ValidationError as exc:
            raise CommandError(validation_message(exc)) from exc
        except DomainError as exc:
            raise CommandError(exc.message) from exc

    def _create(self, tenant: Any, options: dict[str, Any]) -> None:
        issued = services.api_key_create(
            tenant=tenant,
            name=options["name"],
            default_class=options["default_class"],
            expires_at=options["expires"],
            allowed_models=options["models"],
            rpm_limit=options["rpm"],
            tpm_limit=options["tpm"],
        )
        if options["json"]:
            print_json(self.stdout, {**key_as_dict(issued.api_key), "key": issued.raw_key})
            return
        self.stdout.write(
            self.style.SUCCESS(
                f"Created key '{issued.api_key.name}' (id {issued.api_key.pk}) for {tenant.slug}:"
            )
        )
        self.stdout.write(f"  {issued.raw_key}")
        self.stdout.write(self.style.WARNING("Store it now: it is not shown again."))

    def _revoke(self, tenant: Any, options: dict[str, Any]) -> None:
        api_key = services.api_key_revoke(
            api_key=selectors.api_key_get(tenant=tenant, key_id=options["key_id"])
        )
        if options["json"]:
            print_json(self.stdout, key_as_dict(api_key))
            return
        self.stdout.write(
            self.style.SUCCESS(f"Revoked key {api_key.pk} ({api_key.prefix}…) of {tenant.slug}.")
        )

    def _list(self, tenant: Any, options: dict[str, Any]) -> None:
        keys = list(selectors.api_key_list(tenant=tenant))
        if options["json"]:
            print_json(self.stdout, [key_as_dict(k) for k in keys])
            return
        rows = [
            (
                k.pk,
                k.prefix + "…",
                k.name,
                k.default_class,
                k.created_at.strftime("%Y-%m-%d %H:%M"),
                k.last_used_at.strftime("%Y-%m-%d %H:%M") if k.last_used_at else None,
                "revoked" if k.is_revoked else "active",
            )
            for k in keys
        ]
        print_table(
            self.stdout, ("id", "prefix", "name", "class", "created", "last used", "state"), rows
        )
