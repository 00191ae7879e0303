"""The platform's SECRET_KEY: from DJANGO_SECRET_KEY, else a random one kept on this machine.

Sessions, CSRF tokens, the tenants' prefix-cache salts and the engines' keys
(scheduler/engines/auth.py) all derive from it, so it must be secret and the same in every
process of the platform. A fixed default in the code would be neither: anyone could forge a
console session or compute an engine's key. So a machine without DJANGO_SECRET_KEY makes a
random key once, in a file only its user reads (`VAR_DIR/secret_key`), which every process
started from this checkout then reads: `make run` and the tests need no setting. A platform
on several machines sets DJANGO_SECRET_KEY, the same everywhere; the placeholders of the
example files are refused, so that no deployment runs on a published key.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

# What the example files hold in place of a key (platform/): a key anyone can read.
PLACEHOLDERS = frozenset(
    {"CHANGE-ME", "change-me-in-production", "dev-only-insecure-key-change-me"}
)
MIN_LENGTH = 32


def secret_key(configured: str | None, key_file: Path) -> str:
    """`configured` (DJANGO_SECRET_KEY) when set, else the key kept in `key_file`, made on the
    first call. ImproperlyConfigured for a placeholder or a key too short to be secret."""
    if configured:
        if configured in PLACEHOLDERS or len(configured) < MIN_LENGTH:
            raise ImproperlyConfigured(
                "DJANGO_SECRET_KEY is a placeholder or shorter than "
                f"{MIN_LENGTH} characters: set a random one, e.g. "
                "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`."
            )
        return configured
    return _kept_key(key_file)


def _kept_key(key_file: Path) -> str:
    """The key in `key_file`; a new random one if there is none yet. Processes that start
    together agree: the file appears whole (a link to a written temporary file), and a
    process that finds it made already reads the one that won."""
    try:
        return key_file.read_text().strip()
    except FileNotFoundError:
        pass
    key_file.parent.mkdir(parents=True, exist_ok=True)
    temporary = key_file.with_name(f".{key_file.name}.{os.getpid()}.{secrets.token_hex(4)}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(secrets.token_urlsafe(50) + "\n")
    try:
        os.link(temporary, key_file)
    except FileExistsError:
        pass  # another process made it first: its key is the key
    finally:
        temporary.unlink()
    return key_file.read_text().strip()
