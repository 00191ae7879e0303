"""`manage.py report --tenant X [--since ...] [--until ...] [--period ...] [--per ...]
[--format table|csv|json]`: a tenant's usage report from the ledger (tenants.reports)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.dateparse import parse_date, parse_datetime

from plumbing.errors import DomainError
from tenants import reports, selectors
from tenants.management.output import print_json, print_table

# Columns of the table format (the CSV has them all).
TABLE_COLUMNS = (
    "since", "until", "requests", "requests_success", "prompt_tokens", "completion_tokens",
    "reserved_unit_hours", "quota_unit_hours", "quota_utilisation", "peak_reserved_units",
    "seconds_over_quota", "queue_wait_p95_ms", "latency_p50_ms", "latency_p95_ms",
    "latency_p99_ms", "rejected_429", "timeouts",
)  # fmt: skip


def parse_moment(value: str | None) -> datetime | None:
    """An ISO 8601 date or date-time; naive means UTC."""
    if value is None:
        return None
    moment = parse_datetime(value)
    if moment is None:
        day = parse_date(value)
        if day is None:
            raise CommandError(f"Not a date or date-time: {value!r} (use ISO 8601).")
        moment = datetime(day.year, day.month, day.day)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


class Command(BaseCommand):
    help = "Print a tenant's usage report (requests, tokens, quota use, latencies)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="The tenant's slug.")
        parser.add_argument("--since", help="Start (ISO 8601; default: start of --period).")
        parser.add_argument("--until", help="End, exclusive (default: now).")
        parser.add_argument(
            "--period", choices=reports.PERIODS, help="Without --since: the current one."
        )
        parser.add_argument("--per", choices=reports.PERIODS, help="One row per period.")
        parser.add_argument("--format", choices=("table", "csv", "json"), default="table")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            tenant = selectors.tenant_get(slug=options["tenant"])
            since, until = reports.report_range(
                since=parse_moment(options["since"]),
                until=parse_moment(options["until"]),
                period=options["period"],
            )
            rows = reports.tenant_usage_reports(
                tenant=tenant, since=since, until=until, per=options["per"]
            )
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        if options["format"] == "json":
            data: Any = [r.as_dict() for r in rows] if options["per"] else rows[0].as_dict()
            print_json(self.stdout, data)
        elif options["format"] == "csv":
            self.stdout.write(reports.reports_csv(rows), ending="")
        else:
            self.stdout.write(
                f"Tenant {tenant.slug}: quota {tenant.quota_units} units, "
                f"burst {tenant.burst_units} units"
            )
            flat = [reports.report_row(r) for r in rows]
            print_table(
                self.stdout, TABLE_COLUMNS, [[row[c] for c in TABLE_COLUMNS] for row in flat]
            )
