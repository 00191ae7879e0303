"""Usage reports and charts, from the usage ledger (`tenants.reports`): per tenant on its page,
and across tenants with CSV export."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django import forms
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.safestring import mark_safe

from console.charts import Meter, Series, line_chart, meter_chart
from staff.access import console_permission
from staff.roles import Perm
from tenants import reports, selectors
from tenants.models import Tenant

# --- usage charts and reports (from the usage ledger, tenants.reports) -----------------------

# The tenant page's ranges: hourly points over a day, daily points over a month.
USAGE_RANGES: dict[str, tuple[timedelta, reports.Period, str]] = {
    "24h": (timedelta(hours=24), "hour", "last 24 hours, per hour"),
    "30d": (timedelta(days=30), "day", "last 30 days, per day"),
}
# Three charts side by side on the tenant page.
_NARROW: dict[str, Any] = {"plot_width": 290, "plot_height": 150}
SERIES_COLOURS = ("#2f6fb0", "#2f9e6e", "#c98a2b", "#8e5bb5", "#c2255c", "#1b998b")


def _midpoint(report: reports.UsageReport) -> float:
    return (report.since.timestamp() + report.until.timestamp()) / 2


def usage_charts(tenant: Tenant, range_key: str) -> dict[str, str]:
    """Tokens, reserved units against the quota, and latency percentiles over time, each
    point one hour (or day) of the ledger, computed by tenants.reports."""
    span, per, label = USAGE_RANGES[range_key]
    until = timezone.now()
    since = reports.period_start(per, until - span)
    rows = reports.tenant_usage_reports(tenant=tenant, since=since, until=until, per=per)
    start, end = since.timestamp(), until.timestamp()
    tokens = line_chart(
        [
            Series(
                f"tokens per {per}",
                "#2f6fb0",
                [(_midpoint(r), r.prompt_tokens + r.completion_tokens) for r in rows],
            ),
            Series(
                f"completion tokens per {per}",
                "#2f9e6e",
                [(_midpoint(r), r.completion_tokens) for r in rows],
            ),
        ],
        title=f"Tokens of {tenant.slug}, {label}",
        since=start,
        until=end,
        **_NARROW,
    )
    reserved = line_chart(
        [
            Series(
                "mean reserved",
                "#2f6fb0",
                [(_midpoint(r), r.reserved_unit_hours / r.hours) for r in rows if r.hours > 0],
            ),
            Series(
                "peak reserved", "#c98a2b", [(_midpoint(r), r.peak_reserved_units) for r in rows]
            ),
            Series(
                f"quota ({tenant.quota_units} units)",
                "#c0392b",
                [(start, tenant.quota_units), (end, tenant.quota_units)],
                dashed=True,
            ),
        ],
        title=f"KV units reserved by {tenant.slug} against its quota, {label}",
        since=start,
        until=end,
        **_NARROW,
    )
    latency = line_chart(
        [
            Series(
                f"latency {q}",
                colour,
                [(_midpoint(r), r.latency_ms[q]) for r in rows],
            )
            for q, colour in (("p50", "#2f9e6e"), ("p95", "#c98a2b"), ("p99", "#c0392b"))
        ],
        title=f"Latency percentiles of {tenant.slug}, {label}",
        unit=" ms",
        since=start,
        until=end,
        **_NARROW,
    )
    return {
        "tokens": mark_safe(tokens),
        "reserved": mark_safe(reserved),
        "latency": mark_safe(latency),
    }


class ReportForm(forms.Form):
    """What the reports page asks: tenants (none = all), a range, and an optional split."""

    tenants = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple)
    since = forms.DateTimeField(
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        help_text="UTC; empty: the start of today.",
    )
    until = forms.DateTimeField(
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        help_text="UTC, exclusive; empty: now.",
    )
    per = forms.ChoiceField(
        required=False,
        choices=[("", "whole range"), *((p, f"per {p}") for p in reports.PERIODS)],
        label="Rows",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slugs = list(selectors.tenant_list().order_by("slug").values_list("slug", flat=True))
        tenants = self.fields["tenants"]
        assert isinstance(tenants, forms.MultipleChoiceField)
        tenants.choices = [(slug, slug) for slug in self.slugs]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        since, until = _utc(data.get("since")), _utc(data.get("until"))
        try:
            data["since"], data["until"] = reports.report_range(
                since=since, until=until, period="day"
            )
        except reports.BadPeriod as exc:
            raise forms.ValidationError(str(exc)) from None
        return data


def _utc(moment: datetime | None) -> datetime | None:
    if moment is None:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


# The report's rows can be many (per hour over a month, for every tenant): the page keeps to
# this many, the CSV has them all.
REPORT_ROWS_SHOWN = 200


@console_permission(Perm.VIEW)
def reports_view(request: HttpRequest) -> HttpResponse:
    form = ReportForm(request.GET)
    context: dict[str, Any] = {"section": "reports", "form": form}
    if not form.is_valid():
        return render(
            request, "console/reports/index.html", context, status=400 if request.GET else 200
        )
    data = form.cleaned_data
    slugs = data["tenants"] or form.slugs
    chosen = [selectors.tenant_get(slug=slug) for slug in slugs]
    per = data["per"] or None
    rows = [
        report
        for tenant in chosen
        for report in reports.tenant_usage_reports(
            tenant=tenant, since=data["since"], until=data["until"], per=per
        )
    ]
    if request.GET.get("format") == "csv":
        response = HttpResponse(reports.reports_csv(rows), content_type="text/csv; charset=utf-8")
        name = f"usage-{data['since']:%Y%m%dT%H%M}-{data['until']:%Y%m%dT%H%M}.csv"
        response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response
    totals = (
        rows
        if per is None
        else [
            reports.tenant_usage_report(tenant=t, since=data["since"], until=data["until"])
            for t in chosen
        ]
    )
    context.update(
        {
            "rows": [_table_row(r) for r in rows[:REPORT_ROWS_SHOWN]],
            "rows_total": len(rows),
            "rows_shown": REPORT_ROWS_SHOWN,
            "since": data["since"],
            "until": data["until"],
            "per": per,
            "csv_query": _csv_query(request),
            "chart": mark_safe(_report_chart(totals)) if totals else "",
            "trend": mark_safe(_report_trend(rows, chosen, data["since"], data["until"], per))
            if per and rows
            else "",
        }
    )
    return render(request, "console/reports/index.html", context)


def _table_row(report: reports.UsageReport) -> dict[str, Any]:
    """The CSV's row for the table; the CSV's empty cells are None here, shown as a dash."""
    row = {k: None if v == "" else v for k, v in reports.report_row(report).items()}
    return row | {"report": report}


def _csv_query(request: HttpRequest) -> str:
    query = request.GET.copy()
    query["format"] = "csv"
    return query.urlencode()


def _report_chart(totals: list[reports.UsageReport]) -> str:
    return meter_chart(
        [
            Meter(
                r.tenant,
                r.reserved_unit_hours,
                r.quota_unit_hours,
                f"{r.reserved_unit_hours:.3g} reserved of {r.quota_unit_hours:.3g} quota unit-hours"
                + (f" ({r.quota_utilisation:.1%})" if r.quota_utilisation is not None else ""),
            )
            for r in totals
        ],
        title="Reserved unit-hours against each tenant's quota unit-hours (tick)",
    )


def _report_trend(
    rows: list[reports.UsageReport],
    chosen: list[Tenant],
    since: datetime,
    until: datetime,
    per: str,
) -> str:
    return line_chart(
        [
            Series(
                tenant.slug,
                SERIES_COLOURS[i % len(SERIES_COLOURS)],
                [
                    (_midpoint(r), r.prompt_tokens + r.completion_tokens)
                    for r in rows
                    if r.tenant == tenant.slug
                ],
            )
            for i, tenant in enumerate(chosen)
        ],
        title=f"Tokens per {per}",
        since=since.timestamp(),
        until=until.timestamp(),
    )
