"""The Files API's bucket (STORAGES["gpushare_files"] when GPUSHARE_FILES_S3_BUCKET is set);
a module of its own so that boto3 is imported only where a bucket is configured."""

from __future__ import annotations

from botocore.exceptions import ClientError
from django.core.files import File
from storages.backends.s3 import S3Storage
from storages.utils import clean_name


class S3FilesStorage(S3Storage):
    """S3Storage whose reads stream the object's body from the bucket (its own `S3File`
    downloads the whole object into a buffer before the first byte is read)."""

    def _open(self, name: str, mode: str = "rb") -> File:
        if mode != "rb":
            return super()._open(name, mode)
        key = self._normalize_name(clean_name(name))
        try:
            got = self.bucket.Object(key).get()
        except ClientError as err:
            if err.response["ResponseMetadata"]["HTTPStatusCode"] == 404:
                raise FileNotFoundError(f"File does not exist: {key}") from None
            raise
        opened = File(got["Body"], name)
        opened.size = got["ContentLength"]
        return opened
