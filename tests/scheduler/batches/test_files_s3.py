"""The Files and Batch APIs with their bytes in an S3 bucket: a real S3 server (moto's, over
HTTP on a free port) that the web side and the worker side share, and nothing else: each
side's local files folder is a different empty one, so a file written to or read from the
disk fails the batch."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from config.files_storage import files_storage_config
from scheduler.models import Batch, BatchStatus, StoredFile
from tests.api.test_files import assert_streamed_over_asgi, upload
from tests.conftest import bearer_client
from tests.scheduler.batches import test_service as service

pytestmark = pytest.mark.django_db

# The batch service tests' engine and fair queue.
engine = service.engine
queue = service.queue

PREFIX = "gs-files"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def bucket(s3_endpoint, settings, monkeypatch, tmp_path) -> Any:
    """A new bucket on the S3 server, configured as the operator would (the credentials in
    the usual AWS variables); the local files folder is one nothing else uses."""
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(name, value)
    for name in ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    name = f"gpushare-{uuid.uuid4().hex[:12]}"
    client = boto3.resource(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_bucket(Bucket=name)
    settings.STORAGES = {
        **settings.STORAGES,
        "gpushare_files": files_storage_config(
            bucket=name, endpoint_url=s3_endpoint, region="us-east-1", prefix=PREFIX
        ),
    }
    settings.GPUSHARE_BATCH_FILES_DIR = tmp_path / "web-disk"
    return client.Bucket(name)


def keys(bucket: Any) -> set[str]:
    return {item.key for item in bucket.objects.all()}


def test_a_batch_runs_when_web_and_worker_share_only_the_bucket(
    bucket, queue, owner_key, settings, tmp_path
):
    client = bearer_client(owner_key)
    created = service.start_batch(client, service.chat_jsonl(5))
    [upload_key] = keys(bucket)
    stored = StoredFile.objects.get(public_id=Batch.objects.get().input_file_id)
    assert upload_key == f"{PREFIX}/{stored.tenant_id}/{stored.public_id}.jsonl"

    # The worker: another machine, another (empty) disk.
    settings.GPUSHARE_BATCH_FILES_DIR = tmp_path / "worker-disk"
    batch = service.process(created["id"])
    assert batch.status == BatchStatus.IN_PROGRESS, batch.errors
    done = service.run_to_the_end(client, created["id"], queue)

    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": 5, "completed": 5, "failed": 0}
    output = service.file_lines(client, done["output_file_id"])
    assert [line["custom_id"] for line in output] == [f"req-{i}" for i in range(5)]
    assert output[0]["response"]["body"]["id"] == "chatcmpl-req-0"
    assert f"{PREFIX}/{stored.tenant_id}/{done['output_file_id']}.jsonl" in keys(bucket)
    assert not (tmp_path / "web-disk").exists()
    assert not (tmp_path / "worker-disk").exists()


def test_an_input_only_on_the_web_s_disk_fails_the_batch_as_gone(
    queue, owner_key, settings, tmp_path
):
    """What the bucket is for: without it the worker looks on its own disk."""
    settings.GPUSHARE_BATCH_FILES_DIR = tmp_path / "web-disk"
    created = service.start_batch(bearer_client(owner_key), service.chat_jsonl(2))
    settings.GPUSHARE_BATCH_FILES_DIR = tmp_path / "worker-disk"
    batch = service.process(created["id"])
    assert batch.status == BatchStatus.FAILED
    assert batch.errors is not None
    assert batch.errors["data"][0]["code"] == "file_not_found"


def test_content_is_read_back_from_the_bucket_and_streamed_with_its_length(bucket, owner_key):
    content = b"".join(
        b'{"custom_id": "%d", "method": "POST", "url": "/v1/completions", "body": {}}\n' % i
        for i in range(50_000)
    )
    client = bearer_client(owner_key)
    file_id = upload(client, content).json()["id"]
    response = client.get(f"/v1/files/{file_id}/content")
    assert response.streaming
    assert response["Content-Length"] == str(len(content))
    assert response.getvalue() == content
    assert client.get(f"/v1/files/{file_id}").json()["bytes"] == len(content)


def test_deleting_a_file_deletes_its_object(bucket, owner_key, django_capture_on_commit_callbacks):
    client = bearer_client(owner_key)
    kept = upload(client).json()["id"]
    gone = upload(client).json()["id"]
    assert len(keys(bucket)) == 2
    with django_capture_on_commit_callbacks(execute=True):
        assert client.delete(f"/v1/files/{gone}").json()["deleted"] is True
    [left] = keys(bucket)
    assert left.endswith(f"/{kept}.jsonl")
    assert client.get(f"/v1/files/{gone}/content").status_code == 404


def test_a_tenant_cannot_read_or_delete_another_s_file(bucket, owner_key, outsider_key):
    file_id = upload(bearer_client(owner_key)).json()["id"]
    outsider = bearer_client(outsider_key)
    for path in (f"/v1/files/{file_id}", f"/v1/files/{file_id}/content"):
        assert outsider.get(path).status_code == 404
    assert outsider.delete(f"/v1/files/{file_id}").status_code == 404
    assert len(keys(bucket)) == 1
    # Each tenant's objects are under a prefix of its own.
    outsiders = upload(outsider).json()["id"]
    prefixes = {Path(key).parent for key in keys(bucket)}
    assert len(prefixes) == 2
    assert bearer_client(owner_key).get(f"/v1/files/{outsiders}").status_code == 404


def test_an_upload_over_the_limit_leaves_no_object(bucket, owner_key, settings):
    settings.GPUSHARE_BATCH_MAX_FILE_BYTES = 3 * 1024 * 1024
    big = b'{"custom_id": "a"}\n' * (200 * 1024)  # about 3.8 MiB, sent in 1 MiB chunks
    response = upload(bearer_client(owner_key), big)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "file_too_large"
    assert keys(bucket) == set()
    assert StoredFile.objects.count() == 0


def test_a_batch_whose_object_is_gone_fails_as_file_not_found(bucket, queue, owner_key):
    created = service.start_batch(bearer_client(owner_key), service.chat_jsonl(2))
    for item in bucket.objects.all():
        item.delete()
    batch = service.process(created["id"])
    assert batch.status == BatchStatus.FAILED
    assert batch.errors is not None
    assert batch.errors["data"][0]["code"] == "file_not_found"


def test_a_file_larger_than_one_part_is_written_in_parts_and_read_back(bucket, owner):
    from scheduler.batches.files import file_create, file_lines, file_open

    line = b'{"custom_id": "x", "pad": "' + b"p" * 1000 + b'"}\n'
    per_chunk = 1024
    chunks = 12  # about 12 MiB: more than one 8 MiB part of a multipart upload
    stored = file_create(
        tenant=owner,
        purpose="batch_output",
        filename="big.jsonl",
        chunks=(line * per_chunk for _ in range(chunks)),
    )
    assert stored.size_bytes == len(line) * per_chunk * chunks
    with file_open(stored) as handle:
        assert handle.size == stored.size_bytes
        count = 0
        for got in file_lines(handle):
            assert got == line
            count += 1
    assert count == per_chunk * chunks


def test_a_write_past_its_limit_in_the_second_part_leaves_no_object_or_part(bucket, owner):
    from scheduler.batches.files import FileTooLarge, file_create

    mib = b"x" * 1024 * 1024
    with pytest.raises(FileTooLarge):
        file_create(
            tenant=owner,
            purpose="batch",
            filename="big.jsonl",
            chunks=(mib for _ in range(12)),
            limit=10 * 1024 * 1024,
        )
    assert keys(bucket) == set()
    assert list(bucket.multipart_uploads.all()) == []


@pytest.mark.django_db(transaction=True)
def test_content_over_asgi_streams_the_object_a_block_at_a_time(bucket, owner_key):
    content = b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}\n'
    content *= 20_000
    file_id = upload(bearer_client(owner_key), content).json()["id"]
    assert_streamed_over_asgi(owner_key, file_id, content)
