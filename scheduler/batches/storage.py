"""Where the bytes of the Files API live: a Django storage (`STORAGES["gpushare_files"]`).

By default this machine's disk under GPUSHARE_BATCH_FILES_DIR (`LocalFilesStorage`); with
GPUSHARE_FILES_S3_BUCKET set, an S3-compatible bucket (`scheduler.batches.s3_storage`), which
web and workers on different machines share. Both are read and written a chunk at a time: a 200 MB
upload or output never sits in memory whole.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from django.conf import settings
from django.core.files.storage import FileSystemStorage, Storage, storages

STORAGE_ALIAS = "gpushare_files"


def files_storage() -> Storage:
    return storages[STORAGE_ALIAS]


class LocalFilesStorage(FileSystemStorage):
    """The files on this machine's disk, under GPUSHARE_BATCH_FILES_DIR as it is now (read at
    each use, so a settings override points the storage elsewhere at once)."""

    @property
    def base_location(self) -> str:
        return str(settings.GPUSHARE_BATCH_FILES_DIR)

    @property
    def location(self) -> str:
        return os.path.abspath(self.base_location)


class ChunksReader(io.RawIOBase):
    """A readable stream over an iterable of byte chunks (Storage.save reads its content),
    that raises `too_large()` once more than `limit` bytes have come."""

    def __init__(
        self, chunks: Iterable[bytes], limit: int, too_large: Callable[[], BaseException]
    ) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._pending = memoryview(b"")
        self._limit = limit
        self._too_large = too_large
        self.size = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self.size += len(chunk)
            if self.size > self._limit:
                raise self._too_large()
            self._pending = memoryview(chunk)
        count = min(len(buffer), len(self._pending))
        buffer[:count] = self._pending[:count]
        self._pending = self._pending[count:]
        return count


def iter_lines(handle: Any, chunk_size: int) -> Iterator[bytes]:
    """The lines of a binary file as its own iteration gives them (split after each b"\\n"),
    read `chunk_size` bytes at a time from any storage's file."""
    pieces: list[bytes] = []
    while chunk := handle.read(chunk_size):
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            pieces.append(chunk[start : end + 1])
            yield b"".join(pieces)
            pieces = []
            start = end + 1
        if start < len(chunk):
            pieces.append(chunk[start:])
    if pieces:
        yield b"".join(pieces)
