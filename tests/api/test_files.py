"""The Files API: upload, list, read, delete; a tenant sees only its own files."""

import warnings

import pytest

from tests.asgi import asgi_request
from tests.conftest import bearer_client

pytestmark = pytest.mark.django_db

JSONL = b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}\n'


@pytest.fixture
def files_dir(settings, tmp_path):
    settings.GPUSHARE_BATCH_FILES_DIR = tmp_path / "files"
    return settings.GPUSHARE_BATCH_FILES_DIR


def upload(client, content: bytes = JSONL, purpose: str = "batch", name: str = "in.jsonl"):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return client.post(
        "/v1/files",
        {"file": SimpleUploadedFile(name, content), "purpose": purpose},
        format="multipart",
    )


def test_an_upload_is_stored_on_disk_and_described_like_openai(files_dir, owner_key):
    response = upload(bearer_client(owner_key))
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["id"].startswith("file-")
    assert body["object"] == "file"
    assert body["bytes"] == len(JSONL)
    assert body["filename"] == "in.jsonl"
    assert body["purpose"] == "batch"
    assert body["status"] == "processed"
    assert isinstance(body["created_at"], int)
    [stored] = list(files_dir.rglob("*.jsonl"))
    assert stored.read_bytes() == JSONL


def test_owner_and_teammate_share_files_and_an_outsider_gets_404(
    files_dir, owner_key, teammate_key, outsider_key
):
    file_id = upload(bearer_client(owner_key)).json()["id"]
    teammate, outsider = bearer_client(teammate_key), bearer_client(outsider_key)

    assert teammate.get(f"/v1/files/{file_id}").json()["id"] == file_id
    assert teammate.get(f"/v1/files/{file_id}/content").getvalue() == JSONL
    assert [f["id"] for f in teammate.get("/v1/files").json()["data"]] == [file_id]

    for path in (f"/v1/files/{file_id}", f"/v1/files/{file_id}/content"):
        response = outsider.get(path)
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
    assert outsider.delete(f"/v1/files/{file_id}").status_code == 404
    assert outsider.get("/v1/files").json()["data"] == []
    assert teammate.get(f"/v1/files/{file_id}").status_code == 200


def test_delete_removes_the_row_and_the_bytes(
    files_dir, owner_key, django_capture_on_commit_callbacks
):
    client = bearer_client(owner_key)
    file_id = upload(client).json()["id"]
    with django_capture_on_commit_callbacks(execute=True):
        response = client.delete(f"/v1/files/{file_id}")
    assert response.json() == {"id": file_id, "object": "file", "deleted": True}
    assert client.get(f"/v1/files/{file_id}").status_code == 404
    assert list(files_dir.rglob("*.jsonl")) == []


def test_a_file_over_the_size_limit_is_refused_with_413_and_leaves_nothing(
    files_dir, owner_key, settings
):
    settings.GPUSHARE_BATCH_MAX_FILE_BYTES = 10
    response = upload(bearer_client(owner_key))
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "file_too_large"
    assert not any(p.is_file() for p in files_dir.rglob("*"))


def test_an_unknown_purpose_or_a_missing_file_is_a_400(files_dir, owner_key):
    client = bearer_client(owner_key)
    response = upload(client, purpose="fine-tune")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "purpose"
    response = client.post("/v1/files", {"purpose": "batch"}, format="multipart")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "file"


def test_the_list_pages_newest_first_with_an_after_cursor(files_dir, owner_key):
    client = bearer_client(owner_key)
    ids = [upload(client, name=f"{i}.jsonl").json()["id"] for i in range(3)]
    first = client.get("/v1/files", {"limit": 2}).json()
    assert [f["id"] for f in first["data"]] == [ids[2], ids[1]]
    assert first["has_more"] is True
    assert (first["first_id"], first["last_id"]) == (ids[2], ids[1])
    rest = client.get("/v1/files", {"limit": 2, "after": first["last_id"]}).json()
    assert [f["id"] for f in rest["data"]] == [ids[0]]
    assert rest["has_more"] is False
    assert client.get("/v1/files", {"after": "file-nope"}).status_code == 400


def test_content_is_served_whatever_the_client_accepts(files_dir, owner_key):
    client = bearer_client(owner_key)
    file_id = upload(client).json()["id"]
    response = client.get(f"/v1/files/{file_id}/content", HTTP_ACCEPT="application/binary")
    assert response.status_code == 200
    assert response.getvalue() == JSONL


def test_a_tenants_files_may_take_only_so_many_bytes_in_all(files_dir, owner_key, settings):
    settings.GPUSHARE_TENANT_MAX_STORED_BYTES = 2 * len(JSONL) + 10
    client = bearer_client(owner_key)
    first = upload(client).json()["id"]
    assert upload(client).status_code == 200
    refused = upload(client)  # 10 bytes of room left, a file of more
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "storage_limit_reached"
    assert upload(client, content=b"\n" * 10).status_code == 200  # what fits still does
    assert upload(client, content=b"\n").json()["error"]["code"] == "storage_limit_reached"
    client.delete(f"/v1/files/{first}")
    assert upload(client).status_code == 200
    assert len(client.get("/v1/files").json()["data"]) == 3
    assert not list(files_dir.rglob(".upload-*"))  # nothing left of the refused ones


def assert_streamed_over_asgi(issued, file_id: str, content: bytes) -> None:
    """The content as the web serves it (uvicorn's ASGI): whole, with its length, and read a
    block at a time (Django reads a synchronous file whole before sending it, and warns)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        response = asgi_request(
            "GET",
            f"/v1/files/{file_id}/content",
            headers={"Authorization": f"Bearer {issued.raw_key}"},
        )
    assert response.status_code == 200
    assert response.content == content
    assert response.headers["content-length"] == str(len(content))
    assert not [w for w in caught if "synchronous iterators" in str(w.message)]


@pytest.mark.django_db(transaction=True)
def test_content_over_asgi_is_streamed_a_block_at_a_time(files_dir, owner_key):
    content = JSONL * 20_000  # several blocks
    file_id = upload(bearer_client(owner_key), content).json()["id"]
    assert_streamed_over_asgi(owner_key, file_id, content)


@pytest.mark.django_db(transaction=True)
def test_concurrent_uploads_together_never_pass_the_tenants_storage_limit(
    files_dir, owner, settings
):
    """Eight uploads at once, each of which fits alone: all look at the room before any is
    recorded (a barrier holds their bytes until every one has looked), and only the three
    that fit together are kept. Real threads, each with its own database connection."""
    import threading

    from django.db import connection

    if connection.vendor != "postgresql":  # SQLite's test database is shared memory
        pytest.skip("concurrent writers need a database server: set DATABASE_URL")

    from scheduler.batches import files
    from scheduler.models import StoredFile

    size, uploads = 1000, 8
    settings.GPUSHARE_TENANT_MAX_STORED_BYTES = 3 * size + size // 2
    looked = threading.Barrier(uploads, timeout=20)
    outcomes: list[str] = []

    def chunks():
        looked.wait()  # every upload has passed the first look at the room
        yield b"\n" * size

    def upload_one() -> None:
        try:
            files.file_upload(tenant=owner, purpose="batch", filename="a.jsonl", chunks=chunks())
            outcomes.append("stored")
        except files.StorageFull:
            outcomes.append("full")
        finally:
            connection.close()

    threads = [threading.Thread(target=upload_one) for _ in range(uploads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outcomes) == ["full"] * 5 + ["stored"] * 3
    assert StoredFile.objects.filter(tenant=owner).count() == 3
    assert len([p for p in files_dir.rglob("*") if p.is_file()]) == 3  # the refused left nothing
