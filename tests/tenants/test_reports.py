"""Quota reports against a ledger the test builds: totals, percentiles, utilisation, the
reservation curve; JSON, CSV, the command, and who may see whose numbers."""

from __future__ import annotations

import csv
import io
import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command

from tenants.models import Tenant, UsageRecord
from tenants.reports import (
    CSV_COLUMNS,
    Reservation,
    percentile,
    period_windows,
    reservation_summary,
    tenant_usage_report,
)
from tenants.services import IssuedKey
from tests.conftest import bearer_client

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
HOUR = {"since": T0.isoformat(), "until": (T0 + timedelta(hours=1)).isoformat()}


def record(
    tenant: Tenant,
    *,
    run: tuple[float, float] | None = None,
    at: float | None = None,
    outcome: str = "success",
    request_class: str = "standard",
    reserved_units: float = 0.0,
    wait_ms: int = 0,
    prompt: int = 0,
    completion: int = 0,
    status: int = 200,
    user: str = "",
) -> UsageRecord:
    """A ledger row; `run` is the (start, end) of its reservation in seconds after T0."""
    if run is not None:
        start, end = run
        finished = T0 + timedelta(seconds=end)
        latency_ms = int((end - start) * 1000) + wait_ms
        unit_seconds = reserved_units * (end - start)
    else:
        assert at is not None
        finished, latency_ms, unit_seconds = T0 + timedelta(seconds=at), 0, 0.0
    return UsageRecord.objects.create(
        request_id=uuid.uuid4().hex,
        tenant=tenant,
        model="tiny-llama",
        request_class=request_class,
        outcome=outcome,
        status_code=status,
        prompt_tokens=prompt,
        completion_tokens=completion,
        reserved_units=reserved_units,
        reserved_unit_seconds=unit_seconds,
        queue_wait_ms=wait_ms,
        latency_ms=latency_ms,
        finished_at=finished,
        end_user=user,
    )


@pytest.fixture
def ledger(owner: Tenant, outsider: Tenant) -> Tenant:
    owner.quota_units = 2
    owner.save()
    record(owner, run=(100, 200), reserved_units=1.0, wait_ms=1000, prompt=10, completion=20)
    record(owner, run=(150, 250), reserved_units=2.0, wait_ms=500, prompt=5, completion=7,
           request_class="interactive")  # fmt: skip
    record(owner, run=(1000, 1010), reserved_units=0.5, outcome="error", status=500, prompt=3)
    record(owner, at=300, outcome="rejected", status=429)
    record(owner, at=400, outcome="timeout", status=503, request_class="interactive")
    # Started before the hour, finished inside: counted, its reservation clipped to 50 s.
    record(owner, run=(-50, 50), reserved_units=1.0, prompt=1, completion=1)
    # Started inside, finished after: not a request of the hour, but 10 s of its reservation.
    record(owner, run=(3590, 3610), reserved_units=1.0, prompt=100, completion=100)
    # Another tenant's request in the same hour changes nothing of the owner's.
    record(outsider, run=(100, 200), reserved_units=4.0, prompt=999, completion=999)
    return owner


# --- pure arithmetic ----------------------------------------------------------------------


def test_percentiles_interpolate_between_ranks():
    values = [0, 0, 500, 1000]
    assert percentile(values, 50) == 250
    assert percentile(values, 95) == pytest.approx(925)
    assert percentile(values, 99) == pytest.approx(985)
    assert percentile([7], 99) == 7
    assert percentile([], 50) is None


def test_the_reservation_curve_gives_integral_peak_and_time_over_quota():
    summary = reservation_summary(
        [Reservation(0, 10, 1.0), Reservation(5, 15, 2.0), Reservation(20, 30, 1.0)],
        since=0,
        until=100,
        quota_units=2.0,
    )
    assert summary.unit_seconds == pytest.approx(10 + 20 + 10)
    assert summary.peak_units == 3.0
    assert summary.seconds_over_quota == pytest.approx(5)


def test_back_to_back_reservations_do_not_stack():
    summary = reservation_summary(
        [Reservation(0, 10, 2.0), Reservation(10, 20, 2.0)], since=0, until=20, quota_units=2.0
    )
    assert (summary.peak_units, summary.seconds_over_quota) == (2.0, 0.0)


def test_reservations_are_clipped_to_the_window():
    summary = reservation_summary(
        [Reservation(-10, 10, 1.0), Reservation(90, 110, 1.0)], since=0, until=100, quota_units=0
    )
    assert summary.unit_seconds == pytest.approx(20)
    assert summary.seconds_over_quota == pytest.approx(20)


def test_periods_cut_a_range_at_their_boundaries():
    since = datetime(2026, 1, 30, 12, tzinfo=UTC)
    until = datetime(2026, 3, 2, tzinfo=UTC)
    months = period_windows("month", since, until)
    assert [(s.month, s.day, u.month, u.day) for s, u in months] == [
        (1, 30, 2, 1),
        (2, 1, 3, 1),
        (3, 1, 3, 2),
    ]
    days = period_windows("day", since, since + timedelta(days=1))
    assert [(s.hour, u.hour) for s, u in days] == [(12, 0), (0, 12)]


# --- the report from the ledger -------------------------------------------------------------


def test_the_report_counts_requests_tokens_and_refusals(ledger: Tenant):
    report = tenant_usage_report(tenant=ledger, since=T0, until=T0 + timedelta(hours=1))
    assert report.requests == 6
    assert report.requests_by_outcome == {
        "success": 3, "error": 1, "cancelled": 0, "timeout": 1, "rejected": 1,
    }  # fmt: skip
    assert report.requests_by_class["interactive"]["success"] == 1
    assert report.requests_by_class["interactive"]["timeout"] == 1
    assert report.requests_by_class["standard"]["rejected"] == 1
    assert sum(report.requests_by_class["offline"].values()) == 0
    assert (report.prompt_tokens, report.completion_tokens) == (19, 28)
    assert report.rejected_429 == 1
    assert report.timeouts == 1
    assert report.rejections_by_status == {"429": 1, "503": 1}


def test_the_report_gives_percentiles_of_the_requests_that_ran(ledger: Tenant):
    report = tenant_usage_report(tenant=ledger, since=T0, until=T0 + timedelta(hours=1))
    # Waits of the four that ran: 1000, 500, 0, 0 ms; refused ones never waited in line.
    assert report.queue_wait_ms == {
        "p50": 250,
        "p95": pytest.approx(925),
        "p99": pytest.approx(985),
    }
    # Latencies: 101000, 100500, 10000, 100000 ms.
    assert report.latency_ms["p50"] == pytest.approx(100250)
    assert report.latency_ms["p95"] == pytest.approx(100925)
    assert report.latency_ms["p99"] == pytest.approx(100985)


def test_the_report_measures_reservation_against_the_quota(ledger: Tenant):
    report = tenant_usage_report(tenant=ledger, since=T0, until=T0 + timedelta(hours=1))
    unit_seconds = 100 * 1.0 + 100 * 2.0 + 10 * 0.5 + 50 * 1.0 + 10 * 1.0
    assert report.reserved_unit_hours == pytest.approx(unit_seconds / 3600)
    assert report.quota_unit_hours == 2.0
    assert report.quota_utilisation == pytest.approx(unit_seconds / 3600 / 2.0)
    assert report.peak_reserved_units == 3.0
    assert report.seconds_over_quota == pytest.approx(50)


def test_a_tenant_without_quota_has_no_utilisation_rather_than_a_division_by_zero(owner):
    owner.quota_units = 0
    owner.save()
    record(owner, run=(0, 10), reserved_units=1.0)
    report = tenant_usage_report(tenant=owner, since=T0, until=T0 + timedelta(hours=1))
    assert report.quota_utilisation is None
    assert report.seconds_over_quota == pytest.approx(10)


# --- admin API: JSON and CSV --------------------------------------------------------------


def test_the_admin_api_answers_the_report_as_json(staff_client, ledger: Tenant):
    response = staff_client.get("/api/v1/tenants/acme/usage/", HOUR)
    assert response.status_code == 200
    total = response.json()["total"]
    assert set(total) == {
        "tenant", "since", "until", "hours", "quota_units", "burst_units", "requests",
        "tokens", "reservation", "queue_wait_ms", "latency_ms", "rejected_429",
        "rejections_by_status", "timeouts",
    }  # fmt: skip
    assert total["tenant"] == "acme"
    assert total["requests"]["total"] == 6
    assert total["tokens"] == {"prompt": 19, "completion": 28, "total": 47}
    assert total["reservation"]["peak_reserved_units"] == 3.0
    assert total["reservation"]["seconds_over_quota"] == pytest.approx(50)
    assert total["latency_ms"]["p99"] == pytest.approx(100985)


def test_the_admin_api_splits_a_range_per_period(staff_client, ledger: Tenant):
    query = {"since": T0.isoformat(), "until": (T0 + timedelta(hours=2)).isoformat(), "per": "hour"}
    body = staff_client.get("/api/v1/tenants/acme/usage/", query).json()
    assert body["per"] == "hour"
    assert [p["requests"]["total"] for p in body["periods"]] == [6, 1]
    assert body["total"]["requests"]["total"] == 7


def test_the_csv_download_has_a_header_and_a_row_per_period(staff_client, ledger: Tenant):
    query = {"since": T0.isoformat(), "until": (T0 + timedelta(hours=2)).isoformat(), "per": "hour"}
    response = staff_client.get("/api/v1/tenants/acme/usage/csv/", query)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert [r["requests"] for r in rows] == ["6", "1"]
    assert rows[0]["rejected_429"] == "1"
    assert rows[0]["requests_interactive"] == "2"
    assert float(rows[0]["peak_reserved_units"]) == 3.0


def test_the_admin_reports_are_for_staff_only(db, ledger: Tenant, owner_key: IssuedKey):
    response = bearer_client(owner_key).get("/api/v1/tenants/acme/usage/", HOUR)
    assert response.status_code in (401, 403)


def test_an_unknown_tenant_or_a_backwards_range_is_refused(staff_client, ledger: Tenant):
    assert staff_client.get("/api/v1/tenants/nobody/usage/", HOUR).status_code == 404
    backwards = {"since": HOUR["until"], "until": HOUR["since"]}
    assert staff_client.get("/api/v1/tenants/acme/usage/", backwards).status_code == 400


# --- /v1/usage: a tenant's own numbers ------------------------------------------------------


def test_a_key_sees_its_own_tenants_usage(ledger, owner_key: IssuedKey, teammate_key: IssuedKey):
    mine = bearer_client(owner_key).get("/v1/usage", HOUR)
    teammate = bearer_client(teammate_key).get("/v1/usage", HOUR)
    assert mine.status_code == teammate.status_code == 200
    assert mine.json()["total"]["tenant"] == "acme"
    assert mine.json()["total"]["requests"]["total"] == 6
    assert teammate.json() == mine.json()


def test_an_outsider_never_sees_another_tenants_numbers(ledger, outsider_key: IssuedKey):
    theirs = bearer_client(outsider_key).get("/v1/usage", {**HOUR, "tenant": "acme"}).json()
    assert theirs["total"]["tenant"] == "globex"
    assert theirs["total"]["requests"]["total"] == 1
    assert theirs["total"]["tokens"]["prompt"] == 999
    assert "acme" not in json.dumps(theirs)


def test_usage_without_a_key_is_an_openai_style_401(db):
    from rest_framework.test import APIClient

    response = APIClient().get("/v1/usage")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_a_bad_range_on_v1_usage_is_an_openai_style_400(owner_key: IssuedKey):
    response = bearer_client(owner_key).get("/v1/usage", {"since": "yesterday-ish"})
    assert response.status_code == 400
    assert "error" in response.json()


def by_user_of(report: dict) -> dict[str, tuple[int, dict[str, int], int, int]]:
    """End user -> (requests, requests by outcome that are not 0, prompt, completion tokens)."""
    by_user = {}
    for u in report["by_user"]:
        outcomes = {o: n for o, n in u["requests"]["by_outcome"].items() if n}
        tokens = u["tokens"]
        by_user[u["user"]] = (
            u["requests"]["total"],
            outcomes,
            tokens["prompt"],
            tokens["completion"],
        )
    return by_user


def test_a_tenant_s_usage_is_broken_down_by_its_own_end_users(
    owner: Tenant, outsider: Tenant, owner_key: IssuedKey
):
    record(owner, at=10, user="alice", prompt=10, completion=20)
    record(owner, at=20, user="alice", prompt=1, completion=2, outcome="error", status=500)
    record(owner, at=30, user="bob", prompt=5, completion=5)
    record(owner, at=40, prompt=7)  # named nobody
    record(owner, at=50, user="alice", outcome="rejected", status=429)
    record(outsider, at=10, user="alice", prompt=999, completion=999)
    record(owner, at=4000, user="carol", prompt=1000)  # after the hour
    body = bearer_client(owner_key).get("/v1/usage", {**HOUR, "group_by": "user"}).json()
    total = body["total"]
    assert total["users"] == 3
    assert by_user_of(total) == {
        "alice": (3, {"success": 1, "error": 1, "rejected": 1}, 11, 22),
        "bob": (1, {"success": 1}, 5, 5),
        "": (1, {"success": 1}, 7, 0),
    }
    assert [u["user"] for u in total["by_user"]] == ["alice", "bob", ""]  # most tokens first
    assert total["by_user"][0]["tokens"]["total"] == 33
    assert "by_user" not in bearer_client(owner_key).get("/v1/usage", HOUR).json()["total"]


def test_each_period_is_broken_down_by_end_user_too(owner: Tenant, owner_key: IssuedKey):
    record(owner, at=10, user="alice", prompt=1)
    record(owner, at=3700, user="bob", prompt=2)
    two_hours = {**HOUR, "until": (T0 + timedelta(hours=2)).isoformat()}
    body = (
        bearer_client(owner_key)
        .get("/v1/usage", {**two_hours, "per": "hour", "group_by": "user"})
        .json()
    )
    assert [list(by_user_of(p)) for p in body["periods"]] == [["alice"], ["bob"]]
    assert list(by_user_of(body["total"])) == ["bob", "alice"]


def test_a_report_lists_so_many_end_users_and_says_how_many_there_were(
    owner: Tenant, owner_key: IssuedKey, monkeypatch
):
    from tenants import reports

    monkeypatch.setattr(reports, "MAX_USERS", 2)
    for i, user in enumerate(["a", "b", "c", "d"]):
        record(owner, at=10 + i, user=user, prompt=i)
    total = bearer_client(owner_key).get("/v1/usage", {**HOUR, "group_by": "user"}).json()["total"]
    assert total["users"] == 4
    assert [u["user"] for u in total["by_user"]] == ["d", "c"]


def test_an_unknown_grouping_is_an_openai_style_400(owner_key: IssuedKey):
    response = bearer_client(owner_key).get("/v1/usage", {"group_by": "model"})
    assert response.status_code == 400
    assert "error" in response.json()


# --- the command ----------------------------------------------------------------------------


def _report(*args: str) -> str:
    out = io.StringIO()
    call_command("report", "--tenant", "acme", *args, stdout=out)
    return out.getvalue()


def test_the_command_prints_json_csv_and_a_table(ledger: Tenant):
    since, until = "--since", HOUR["since"]
    data = json.loads(_report(since, until, "--until", HOUR["until"], "--format", "json"))
    assert data["requests"]["total"] == 6
    assert data["reservation"]["seconds_over_quota"] == pytest.approx(50)
    text = _report(since, until, "--until", HOUR["until"], "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["requests"] for r in rows] == ["6"]
    table = _report("--since", "2026-11-02", "--until", "2026-11-03", "--per", "day")
    assert "Tenant acme" in table
    assert "REQUESTS" in table
    assert "2026-11-02T00:00:00+00:00" in table


def test_the_command_splits_per_period_in_json(ledger: Tenant):
    data = json.loads(
        _report("--since", HOUR["since"], "--until", "2026-11-02T12:00:00", "--per", "hour",
                "--format", "json")
    )  # fmt: skip
    assert [d["requests"]["total"] for d in data] == [6, 1]


def test_the_command_refuses_an_unknown_tenant(db):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="No tenant"):
        call_command("report", "--tenant", "nobody", stdout=io.StringIO())


def test_a_tenants_report_reads_only_so_many_ledger_rows(ledger, owner_key, settings):
    settings.GPUSHARE_USAGE_MAX_ROWS = 6  # acme's hour holds 6
    assert bearer_client(owner_key).get("/v1/usage", HOUR).status_code == 200
    settings.GPUSHARE_USAGE_MAX_ROWS = 5
    refused = bearer_client(owner_key).get("/v1/usage", HOUR)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "bad_period"
    assert "shorter range" in refused.json()["error"]["message"]
