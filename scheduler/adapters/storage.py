"""An adapter's files: kept in the files storage (`scheduler.batches.storage`, the disk or a
bucket), copied once to each node that loads it (GPUSHARE_ADAPTER_DIR), where its engines
read them: vLLM loads an adapter from a folder of its own machine."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from django.conf import settings
from django.core.files import File

from scheduler.adapters.models import Adapter
from scheduler.batches.storage import files_storage

# A node's copy is whole once this file is in it.
COMPLETE = ".gpushare-complete"
STORAGE_FOLDER = "adapters"


def storage_save(prefix: str, files: list[Path]) -> None:
    storage = files_storage()
    for path in files:
        name = f"{prefix}/{path.name}"
        if storage.exists(name):
            storage.delete(name)
        with path.open("rb") as handle:
            storage.save(name, File(handle, name=path.name))


def storage_delete(prefix: str) -> None:
    storage = files_storage()
    try:
        _, names = storage.listdir(prefix)
    except FileNotFoundError:  # on the disk: nothing was saved under it
        return
    for name in names:
        storage.delete(f"{prefix}/{name}")


def local_dir(adapter: Adapter) -> Path:
    """The adapter's folder on this node, copied from the files storage the first time.
    Readable by every user: an engine may run as a user of its own."""
    folder = Path(settings.GPUSHARE_ADAPTER_DIR) / adapter.storage_prefix.rsplit("/", 1)[-1]
    if (folder / COMPLETE).exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(folder.parent, 0o755)
    storage = files_storage()
    building = Path(tempfile.mkdtemp(prefix=".building-", dir=folder.parent))
    try:
        _, names = storage.listdir(adapter.storage_prefix)
        for name in names:
            source_name, target = f"{adapter.storage_prefix}/{name}", building / name
            with storage.open(source_name, "rb") as source, target.open("wb") as copy:
                shutil.copyfileobj(source, copy)
            os.chmod(building / name, 0o644)
        (building / COMPLETE).touch()
        os.chmod(building, 0o755)
        try:
            building.rename(folder)
        except OSError:  # another process copied it meanwhile
            if not (folder / COMPLETE).exists():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return folder


def local_forget(adapter: Adapter) -> None:
    """Deletes this node's copy (the adapter was removed)."""
    folder = Path(settings.GPUSHARE_ADAPTER_DIR) / adapter.storage_prefix.rsplit("/", 1)[-1]
    shutil.rmtree(folder, ignore_errors=True)
