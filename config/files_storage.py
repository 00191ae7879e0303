"""The STORAGES entry of the Files API's bytes (`scheduler.batches.storage`), from the settings."""

from __future__ import annotations

from typing import Any


def files_storage_config(
    *, bucket: str, endpoint_url: str = "", region: str = "", prefix: str = ""
) -> dict[str, Any]:
    """This machine's disk (GPUSHARE_BATCH_FILES_DIR) without a bucket; else the bucket,
    private, its credentials from boto3's usual chain (environment, profile, role)."""
    if not bucket:
        return {"BACKEND": "scheduler.batches.storage.LocalFilesStorage"}
    from boto3.s3.transfer import TransferConfig  # boto3 only where a bucket is set

    return {
        "BACKEND": "scheduler.batches.s3_storage.S3FilesStorage",
        "OPTIONS": {
            "bucket_name": bucket,
            "endpoint_url": endpoint_url or None,
            "region_name": region or None,
            "location": prefix.strip("/"),
            # Every S3-compatible service answers path-style addresses; virtual-host ones
            # (bucket.host) need DNS that such a service seldom has.
            "addressing_style": "path" if endpoint_url else None,
            # The objects are private, read through the API only.
            "default_acl": None,
            # A write reads its content in the calling thread: the content of a batch's
            # output is a query of the worker's database connection and transaction, which
            # another thread would not share. The parts of a large upload go one at a time.
            "transfer_config": TransferConfig(use_threads=False),
            # A name is never reused (each file's is random): no existence check per write.
            "file_overwrite": True,
        },
    }
