"""`manage.py audit list [--actor ...] [--action tenant.] [--csv|--json]`: the audit log."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from audit import selectors


class Command(BaseCommand):
    help = "List the audit log, newest first, filtered."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action_name", required=True, metavar="ACTION")
        listing = actions.add_parser("list")
        listing.add_argument("--actor", default="")
        listing.add_argument("--action", default="", help="A prefix: tenant. finds every one.")
        listing.add_argument("--object-type", default="")
        listing.add_argument("--object-id", default="")
        listing.add_argument("--since", type=datetime.fromisoformat)
        listing.add_argument("--until", type=datetime.fromisoformat)
        listing.add_argument("--limit", type=int, default=50)
        out = listing.add_mutually_exclusive_group()
        out.add_argument("--json", action="store_true")
        out.add_argument("--csv", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        events = selectors.audit_events(
            actor=options["actor"],
            action=options["action"],
            object_type=options["object_type"],
            object_id=options["object_id"],
            since=options["since"],
            until=options["until"],
        )[: options["limit"]]
        if options["csv"]:
            self.stdout.write(selectors.events_csv(events), ending="")
            return
        if options["json"]:
            self.stdout.write(json.dumps([selectors.event_row(e) for e in events], indent=2))
            return
        for event in events:
            changed = ",".join(event.changed_fields)
            self.stdout.write(
                f"{event.at:%Y-%m-%d %H:%M:%S} {event.actor} ({event.via}"
                f"{' ' + event.remote_addr if event.remote_addr else ''}) {event.action} "
                f"{event.object_type} {event.object_id} {changed}".rstrip()
            )
