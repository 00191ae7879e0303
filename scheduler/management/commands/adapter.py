"""`manage.py adapter register|list|remove`: tenants' LoRA adapters.

`register TENANT NAME --base MODEL --from FOLDER` copies a PEFT LoRA adapter's folder
(adapter_config.json and its weights) into the files storage as the tenant's `NAME`, its
units held against the tenant's quota; the tenant then calls `NAME` as a model, and the
engines of `MODEL` load it when a request names it. `list` shows every adapter (or one
tenant's) and the engines that hold it now; `remove NAME` unloads it everywhere and deletes
it. `--json` prints what `list` shows as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from plumbing.errors import DomainError
from plumbing.redis import redis_client
from scheduler.adapters.loading import loaded_on
from scheduler.adapters.models import Adapter
from scheduler.adapters.selectors import adapter_get, adapter_list
from scheduler.adapters.services import adapter_register, adapter_remove
from scheduler.models import Engine
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Register, list and remove tenants' LoRA adapters."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        register = sub.add_parser("register", help="register a tenant's adapter")
        register.add_argument("tenant", help="the tenant's slug")
        register.add_argument("name", help="the model name the tenant will call it by")
        register.add_argument("--base", required=True, help="the served model it adapts")
        register.add_argument(
            "--from", dest="folder", required=True, help="the PEFT adapter's folder"
        )
        listing = sub.add_parser("list", help="show adapters and the engines that hold them")
        listing.add_argument("--tenant", default=None, help="one tenant's only")
        listing.add_argument("--json", action="store_true")
        sub.add_parser("remove", help="unload and delete an adapter").add_argument("name")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["action"] == "register":
                adapter = adapter_register(
                    tenant=self._tenant(options["tenant"]),
                    name=options["name"],
                    base_model=options["base"],
                    folder=Path(options["folder"]),
                )
                self.stdout.write(
                    f"Registered adapter '{adapter.name}' of {adapter.base_model} for "
                    f"{adapter.tenant.slug}: rank {adapter.rank}, {adapter.units_display}."
                )
            elif options["action"] == "list":
                self._list(options["tenant"], options["json"])
            else:
                found = adapter_get(name=options["name"])
                if found is None:
                    raise CommandError(f"No adapter '{options['name']}'.")
                adapter_remove(adapter=found)
                self.stdout.write(f"Removed adapter '{found.name}'.")
        except DomainError as exc:
            raise CommandError(exc.message) from None

    @staticmethod
    def _tenant(slug: str) -> Tenant:
        tenant = Tenant.objects.filter(slug=slug).first()
        if tenant is None:
            raise CommandError(f"No tenant '{slug}'.")
        return tenant

    def _list(self, slug: str | None, as_json: bool) -> None:
        adapters = list(adapter_list(tenant=self._tenant(slug) if slug else None))
        rows = [self._row(adapter) for adapter in adapters]
        if as_json:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        if not rows:
            self.stdout.write("No adapters: register one with `manage.py adapter register`.")
        for row in rows:
            self.stdout.write(
                f"{row['name']}: {row['tenant']}'s, of {row['base_model']}, rank {row['rank']}, "
                f"{row['units']} units; loaded on {', '.join(row['loaded_on']) or 'no engine'}"
            )

    @staticmethod
    def _row(adapter: Adapter) -> dict[str, Any]:
        client = redis_client()
        engines = Engine.objects.filter(served_model_name=adapter.base_model, max_loras__gt=0)
        return {
            "name": adapter.name,
            "tenant": adapter.tenant.slug,
            "base_model": adapter.base_model,
            "rank": adapter.rank,
            "units": adapter.units,
            "size_bytes": adapter.size_bytes,
            "loaded_on": [e.name for e in engines if adapter.name in loaded_on(client, e.name)],
        }
