"""API key material: generation and hashing. Pure: no database."""

import hashlib
import secrets
from dataclasses import dataclass

from django.conf import settings

# 32 random bytes in URL-safe base64: 43 characters, 256 bits.
_SECRET_BYTES = 32
# Characters of a key kept in clear to recognise it in lists ("gs-AbCdEfGh").
DISPLAY_PREFIX_LENGTH = 11


@dataclass(frozen=True)
class KeyMaterial:
    raw_key: str  # shown once, never stored
    prefix: str
    hashed_key: str


def hash_key(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode("utf-8")).hexdigest()


def new_key_material() -> KeyMaterial:
    raw_key = f"{settings.GPUSHARE_API_KEY_PREFIX}{secrets.token_urlsafe(_SECRET_BYTES)}"
    return KeyMaterial(
        raw_key=raw_key, prefix=raw_key[:DISPLAY_PREFIX_LENGTH], hashed_key=hash_key(raw_key)
    )
