"""The console's batch pages: every tenant's batches with progress, one batch's counts,
errors and files (staff only; files of another batch are not served through this one)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from django.test import Client
from django.utils import timezone

from scheduler.batches.files import file_create
from scheduler.models import Batch, BatchLine, BatchStatus, FilePurpose, LineState
from tenants.models import Tenant
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def files_dir(settings: Any, tmp_path: Path) -> Path:
    settings.GPUSHARE_BATCH_FILES_DIR = tmp_path / "files"
    return settings.GPUSHARE_BATCH_FILES_DIR


def make_batch(
    tenant: Tenant, public_id: str, states: Sequence[str], status: str = BatchStatus.IN_PROGRESS
) -> Batch:
    """A batch whose lines are in `states`; failed lines carry an error, as the runner writes."""
    source = file_create(
        tenant=tenant, purpose=FilePurpose.BATCH, filename="in.jsonl", chunks=[b"{}\n"]
    )
    batch = Batch.objects.create(
        public_id=public_id,
        tenant=tenant,
        endpoint="/v1/chat/completions",
        input_file_id=source.public_id,
        status=status,
        expires_at=timezone.now() + timedelta(hours=24),
    )
    for index, state in enumerate(states, start=1):
        BatchLine.objects.create(
            batch=batch,
            index=index,
            custom_id=f"req-{index}",
            model="llama",
            body={},
            state=state,
            error={"code": "engine_error", "message": f"line {index} broke"}
            if state == LineState.FAILED
            else None,
        )
    return batch


@pytest.fixture
def batches(redis_db: redis.Redis) -> list[Batch]:
    acme = TenantFactory.create(slug="acme")
    globex = TenantFactory.create(slug="globex")
    return [
        make_batch(
            acme,
            "batch_acme1",
            [LineState.SUCCEEDED] * 6 + [LineState.FAILED] * 2 + [LineState.PENDING] * 2,
        ),
        make_batch(globex, "batch_globex1", [LineState.SUCCEEDED] * 4, BatchStatus.COMPLETED),
    ]


def test_the_list_shows_every_tenants_batches_with_progress(console: Client, batches: list[Batch]):
    html = console.get("/console/batches/").content.decode()

    acme = re.search(r'<tr data-batch="batch_acme1">.*?</tr>', html, re.S)
    globex = re.search(r'<tr data-batch="batch_globex1">.*?</tr>', html, re.S)
    assert acme is not None
    assert globex is not None
    assert "8 / 10" in acme.group(0)
    assert 'aria-valuenow="80.0"' in acme.group(0)
    assert 'class="done" style="width:60%"' in acme.group(0)
    assert 'class="failed" style="width:20%"' in acme.group(0)
    assert "in_progress" in acme.group(0)
    assert 'aria-valuenow="100.0"' in globex.group(0)
    assert 'hx-trigger="every 5s"' in html  # one batch still runs: the table refreshes


def test_the_list_filters_by_status_and_tenant(console: Client, batches: list[Batch]):
    completed = console.get("/console/batches/?status=completed").content.decode()
    acme = console.get("/console/batches/?tenant=acme").content.decode()

    assert "batch_globex1" in completed
    assert "batch_acme1" not in completed
    assert "batch_acme1" in acme
    assert "batch_globex1" not in acme


def test_a_batch_page_shows_counts_failed_lines_and_files(console: Client, batches: list[Batch]):
    html = console.get("/console/batches/batch_acme1/").content.decode()

    assert re.search(r'id="count-total">10<', html)
    assert re.search(r'id="count-completed">6<', html)
    assert re.search(r'id="count-failed">2<', html)
    assert "line 7 broke" in html
    assert "req-8" in html
    assert f"/console/batches/batch_acme1/files/{batches[0].input_file_id}/" in html
    assert "Cancel batch" in html
    assert 'hx-select="#batch-live"' in html  # counts refresh while it runs


def test_a_failed_batch_lists_its_validation_errors(console: Client, batches: list[Batch]):
    Batch.objects.filter(pk=batches[1].pk).update(
        status=BatchStatus.FAILED,
        errors={
            "object": "list",
            "data": [{"line": 3, "code": "invalid_json", "message": "Line 3 is not JSON."}],
        },
    )

    html = console.get("/console/batches/batch_globex1/").content.decode()

    assert "Line 3 is not JSON." in html
    assert "invalid_json" in html
    assert "Cancel batch" not in html
    assert 'hx-select="#batch-live"' not in html  # a finished batch does not poll


def test_staff_download_a_batchs_file(console: Client, batches: list[Batch]):
    batch = batches[0]

    response = console.get(f"/console/batches/batch_acme1/files/{batch.input_file_id}/")

    assert response.status_code == 200
    assert b"".join(response.streaming_content) == b"{}\n"  # type: ignore[attr-defined]
    assert "attachment" in response["Content-Disposition"]


def test_another_batchs_file_is_not_served_through_this_batch(
    console: Client, batches: list[Batch]
):
    other = batches[1].input_file_id

    assert console.get(f"/console/batches/batch_acme1/files/{other}/").status_code == 404
    assert console.get("/console/batches/batch_nope/").status_code == 404


def test_cancel_from_the_console_stops_admitting_lines(console: Client, batches: list[Batch]):
    response = console.post("/console/batches/batch_acme1/cancel/", follow=True)

    batch = Batch.objects.get(public_id="batch_acme1")
    assert batch.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED)
    assert "cancelling" in response.content.decode()


def test_batch_pages_are_for_staff_only(client: Client, batches: list[Batch]):
    for url in ("/console/batches/", "/console/batches/batch_acme1/"):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/")
