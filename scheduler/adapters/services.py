"""Writes of adapters: registering one (its files into the files storage, its units against
its tenant's quota) and removing one (unloaded from the engines, its files deleted)."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

from django.conf import settings
from django.db import transaction

from capacity.adapters import adapter_units
from plumbing.errors import Conflict, DomainError, NotFound
from plumbing.redis import redis_client
from scheduler.adapters import loading, storage
from scheduler.adapters.models import Adapter
from scheduler.adapters.selectors import adapter_get, tenant_adapter_units
from scheduler.models import Engine, EngineTask, Pool
from scheduler.selectors import tenant_dedicated_units
from tenants.models import Tenant
from tenants.services import tenant_changes

# A model name a client can send as it is: letters, digits and . _ - : / (as OpenAI's
# fine-tuned models' names, e.g. "ft:base:org:suffix:id").
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}")
WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


class AdapterInvalid(DomainError):
    code = "adapter_invalid"


def _read_config(folder: Path) -> dict[str, object]:
    path = folder / "adapter_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AdapterInvalid(
            f"{folder} has no adapter_config.json: is it a PEFT adapter?"
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise AdapterInvalid(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(config, dict) or str(config.get("peft_type", "")).upper() != "LORA":
        raise AdapterInvalid(f"{path} is not a LoRA adapter's (peft_type must be LORA).")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise AdapterInvalid(f"{path} needs a positive integer rank r, got {rank!r}.")
    return config


def _check_name(name: str, base_model: str) -> None:
    if not NAME.fullmatch(name):
        raise DomainError(
            f"An adapter's name is 1-200 letters, digits and . _ - : / (from a letter or "
            f"digit), not {name!r}.",
            param="name",
        )
    if adapter_get(name=name) is not None:
        raise Conflict(f"An adapter named '{name}' exists already.", param="name")
    served = Engine.objects.filter(served_model_name=name).exists()
    if served or Pool.objects.filter(served_model_name=name).exists():
        raise Conflict(f"'{name}' is a served model's name.", param="name")


def _check_base(base_model: str, rank: int) -> None:
    engines = Engine.objects.filter(served_model_name=base_model)
    if not engines.exists():
        raise NotFound(f"No engine serves the model '{base_model}'.", param="base_model")
    lora = engines.filter(task=EngineTask.GENERATE, max_loras__gt=0)
    if not lora.exists():
        raise DomainError(
            f"No engine of '{base_model}' serves adapters: create them with --max-loras.",
            param="base_model",
        )
    low = lora.filter(max_lora_rank__lt=rank).first()
    if low is not None:
        raise AdapterInvalid(
            f"The adapter's rank {rank} is over engine '{low.name}'s max_lora_rank "
            f"{low.max_lora_rank}.",
            param="rank",
        )


def _check_quota(tenant: Tenant, units: int) -> None:
    held = tenant_dedicated_units(tenant=tenant) + tenant_adapter_units(tenant=tenant)
    if held + units > tenant.quota_units:
        raise DomainError(
            f"Tenant '{tenant.slug}' holds {held} of its {tenant.quota_units} units (its "
            f"dedicated engines and adapters); this adapter needs {units} more.",
            code="insufficient_quota",
        )


def adapter_register(*, tenant: Tenant, name: str, base_model: str, folder: Path) -> Adapter:
    """Registers the PEFT LoRA adapter in `folder` (adapter_config.json and its weights)
    as `tenant`'s `name`, for the engines of `base_model`. Its files' units are held against
    the tenant's quota from now on (any engine may load it at any time), so it is refused
    where they do not fit beside what the tenant holds already."""
    folder = Path(folder)
    config = _read_config(folder)
    rank = int(config["r"])  # type: ignore[call-overload]
    if not any((folder / weights).is_file() for weights in WEIGHTS):
        raise AdapterInvalid(f"{folder} has neither of {', '.join(WEIGHTS)}.")
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    size = sum(p.stat().st_size for p in files)
    if size > settings.GPUSHARE_ADAPTER_MAX_BYTES:
        raise AdapterInvalid(
            f"The adapter's files hold {size} bytes; the limit is "
            f"{settings.GPUSHARE_ADAPTER_MAX_BYTES} (GPUSHARE_ADAPTER_MAX_BYTES)."
        )
    units = adapter_units(size)
    _check_name(name, base_model)
    _check_base(base_model, rank)
    prefix = f"{storage.STORAGE_FOLDER}/{tenant.pk}/{uuid.uuid4().hex}"
    with transaction.atomic():
        locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
        _check_quota(locked, units)
        storage.storage_save(prefix, files)
        try:
            adapter = Adapter.objects.create(
                name=name, tenant=locked, base_model=base_model, rank=rank, size_bytes=size,
                units=units, storage_prefix=prefix,
            )  # fmt: skip
        except Exception:
            storage.storage_delete(prefix)
            raise
        tenant_changes().bump()  # its quota's policy, and the web's lookups of adapters
    return adapter


def adapter_remove(*, adapter: Adapter) -> None:
    """Removes the adapter: its tenant can no longer call it, the engines that hold it
    unload it, its files are deleted and its units go back to its tenant's quota."""
    engines = list(Engine.objects.filter(served_model_name=adapter.base_model, max_loras__gt=0))
    with transaction.atomic():
        adapter.delete()
        tenant_changes().bump()
    loading.unload_everywhere(redis_client(), engines, adapter.name)
    storage.storage_delete(adapter.storage_prefix)
    storage.local_forget(adapter)
