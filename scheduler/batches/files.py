"""Files of the OpenAI Files API: a tenant's batch inputs and its batches' outputs.

The bytes are in the files storage (`scheduler.batches.storage`: this machine's disk, or a bucket
shared by web and workers), under a key that starts with the tenant's id; the index is in
the database (`StoredFile`). Every read goes through the tenant: another tenant's file id is
answered exactly like an unknown one (404), so ids reveal nothing.
"""

from __future__ import annotations

import io
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.files import File
from django.db import transaction
from django.db.models import QuerySet, Sum
from django.http import FileResponse

from plumbing.errors import DomainError, NotFound
from scheduler.batches.storage import ChunksReader, files_storage, iter_lines
from scheduler.models import FilePurpose, StoredFile
from tenants.models import Tenant

log = logging.getLogger(__name__)

COPY_CHUNK_BYTES = 1024 * 1024


class FileTooLarge(DomainError):
    http_status = 413
    code = "file_too_large"


class InvalidFile(DomainError):
    code = "invalid_file"


class StorageFull(DomainError):
    code = "storage_limit_reached"


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def file_open(stored: StoredFile) -> File:
    """The file's bytes, to read (and close); OSError (FileNotFoundError) when they are gone."""
    return files_storage().open(stored.relative_path, "rb")


class FileStreamResponse(FileResponse):
    """A file's bytes as the response. Served over ASGI, Django would read a synchronous file
    whole into a list before sending its first byte; this reads it a block at a time, each
    in a thread, so a download holds one block in memory and never blocks the event loop."""

    block_size = 256 * 1024

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self.file_to_stream is None:
            return
        read = sync_to_async(self.file_to_stream.read, thread_sensitive=False)
        while chunk := await read(self.block_size):
            yield chunk


def file_response(stored: StoredFile, content_type: str) -> FileStreamResponse:
    """The file's bytes as a download; OSError when they are gone."""
    response = FileStreamResponse(
        file_open(stored), as_attachment=True, filename=stored.filename, content_type=content_type
    )
    # A bucket's stream does not say its length itself.
    response.headers["Content-Length"] = str(stored.size_bytes)
    return response


def file_lines(handle: File) -> Iterator[bytes]:
    """The lines of an opened file, each with its b"\\n", read a chunk at a time."""
    return iter_lines(handle, COPY_CHUNK_BYTES)


def _save(name: str, chunks: Iterable[bytes], limit: int) -> int:
    """Writes `chunks` to the storage under `name`, streaming; raises FileTooLarge past
    `limit` bytes, and then nothing is left. A reader finds the bytes only through the row
    created after this returns, so it never sees half a file."""

    def too_large() -> FileTooLarge:
        return FileTooLarge(f"The file is larger than the limit of {limit} bytes.")

    reader = ChunksReader(chunks, limit, too_large)
    storage = files_storage()
    try:
        saved = storage.save(name, File(io.BufferedReader(reader, COPY_CHUNK_BYTES), name))
    except BaseException:
        _discard(name)
        raise
    if saved != name:  # the names are random: a storage never needs to pick another
        _discard(saved)
        raise RuntimeError(f"The files storage saved {name} as {saved}.")
    return reader.size


def _discard(name: str) -> None:
    """Deletes what a failed write may have left; a failure here leaves an orphan (no row
    points at it) and must not hide the write's own error."""
    try:
        files_storage().delete(name)
    except Exception:
        log.exception("could not delete %s from the files storage", name)


def file_upload(
    *, tenant: Tenant, purpose: str, filename: str, chunks: Iterable[bytes]
) -> StoredFile:
    """Stores a tenant's upload, within what its files may take in all
    (GPUSHARE_TENANT_MAX_STORED_BYTES; the batches' outputs count, and are always written).

    The room is looked at twice: before the bytes are written, to bound the write, and again
    once their size is known, under a lock on the tenant's row, in the transaction that
    records the file. Concurrent uploads so take their turns at the second look, each
    seeing the files recorded before it: together they never pass the limit."""
    allowed = settings.GPUSHARE_TENANT_MAX_STORED_BYTES
    room = allowed - _stored_bytes(tenant)
    if room <= 0:
        raise _storage_full(allowed - room, allowed)

    def within_room(size: int) -> None:
        stored = _stored_bytes(tenant)
        if stored + size > allowed:
            raise _storage_full(stored, allowed)

    limit = settings.GPUSHARE_BATCH_MAX_FILE_BYTES
    try:
        return file_create(
            tenant=tenant,
            purpose=purpose,
            filename=filename,
            chunks=chunks,
            limit=min(limit, room),
            admit=within_room,
        )
    except FileTooLarge:
        if room < limit:
            raise _storage_full(allowed - room, allowed) from None
        raise


def _stored_bytes(tenant: Tenant) -> int:
    total = StoredFile.objects.filter(tenant=tenant).aggregate(total=Sum("size_bytes"))["total"]
    return int(total or 0)


def _storage_full(stored: int, allowed: int) -> StorageFull:
    return StorageFull(
        f"The tenant's files take {stored} of the {allowed} bytes they may; delete some "
        "(DELETE /v1/files/{file_id}) before uploading more.",
        param="file",
    )


def file_create(
    *,
    tenant: Tenant,
    purpose: str,
    filename: str,
    chunks: Iterable[bytes],
    limit: int | None = None,
    admit: Callable[[int], None] | None = None,
) -> StoredFile:
    """Stores an upload (or a batch's output) for `tenant`, of at most `limit` bytes (default
    GPUSHARE_BATCH_MAX_FILE_BYTES). `admit(size)`, when given, decides whether the written
    file is kept (it raises to refuse it): it runs under a lock on the tenant's row, in the
    transaction that records the file, so that one file of the tenant is admitted at a time."""
    if purpose not in FilePurpose.values:
        raise InvalidFile(
            f"Unsupported purpose {purpose!r}; use 'batch'.",
            param="purpose",
            code="invalid_purpose",
        )
    public_id = new_file_id()
    # The tenant's prefix keeps its objects apart; the id's 96 random bits make the key
    # unguessable.
    relative = f"{tenant.pk}/{public_id}.jsonl"
    size = _save(relative, chunks, limit or settings.GPUSHARE_BATCH_MAX_FILE_BYTES)
    try:
        with transaction.atomic():
            if admit is not None:
                # Held until the row below is committed: the next admission waits, then
                # counts this file.
                list(Tenant.objects.select_for_update().filter(pk=tenant.pk).values("pk"))
                admit(size)
            return StoredFile.objects.create(
                public_id=public_id,
                tenant=tenant,
                purpose=purpose,
                filename=(filename or "upload.jsonl")[:255],
                size_bytes=size,
                relative_path=relative,
            )
    except BaseException:
        _discard(relative)
        raise


def file_delete(*, stored: StoredFile) -> None:
    name = stored.relative_path
    with transaction.atomic():
        stored.delete()
        # The row goes first: if deleting the bytes fails they are an orphan, never a row
        # pointing at nothing.
        transaction.on_commit(lambda: files_storage().delete(name))


# --- selectors --------------------------------------------------------------------------


def file_list(*, tenant: Tenant, purpose: str | None = None) -> QuerySet[StoredFile]:
    files = StoredFile.objects.filter(tenant=tenant)
    if purpose:
        files = files.filter(purpose=purpose)
    return files


def file_get(*, tenant: Tenant, file_id: str) -> StoredFile:
    stored = StoredFile.objects.filter(tenant=tenant, public_id=file_id).first()
    if stored is None:
        raise NotFound(f"No such File object: {file_id}", param="id")
    return stored


@dataclass(frozen=True)
class Page:
    """One page of a list, as OpenAI's cursor pages: newest first, `after` = last id seen."""

    items: list[Any]
    has_more: bool


def paginate(queryset: QuerySet[Any], *, after: str | None, limit: int) -> Page:
    """Pages a queryset ordered newest first (by -pk) with OpenAI's `after` cursor; an
    unknown cursor is a 400 rather than silently restarting from the top."""
    if after:
        anchor = queryset.filter(public_id=after).values_list("pk", flat=True).first()
        if anchor is None:
            raise DomainError(f"Unknown cursor 'after': {after}", param="after")
        queryset = queryset.filter(pk__lt=anchor)
    rows = list(queryset.order_by("-pk")[: limit + 1])
    return Page(items=rows[:limit], has_more=len(rows) > limit)


def file_object(stored: StoredFile) -> dict[str, Any]:
    """The file as OpenAI's `FileObject`."""
    return {
        "id": stored.public_id,
        "object": "file",
        "bytes": stored.size_bytes,
        "created_at": int(stored.created_at.timestamp()),
        "filename": stored.filename,
        "purpose": stored.purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }
