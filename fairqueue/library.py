"""The fair queue's scripts as one Redis Functions library, loaded once and called by name.

`lua/lib.lua` (the shared helpers) is the library's top level; each script file in `lua/`
becomes one function whose body is that file, run after `begin` has read the call's key
(its pool's tag prefix: every call names one key, of the slot it touches, which a cluster
routes it by) and its common arguments (`begin_keyed`, for the quota leases' functions,
which are called with their keys whole). Redis runs the top level when the library is
loaded, not on every call as it would for a script sent with EVALSHA, where the helpers'
hundred-odd closures are made again each time (see
docs/decisions/0012-fair-queue-as-redis-functions.md).

The library's name carries a hash of its source: processes of two releases side by side (a
rolling upgrade) each call their own library's functions, and an old library stays until an
operator deletes it (`FUNCTION DELETE`). Redis keeps loaded libraries in its RDB and AOF and
sends them to its replicas; a Redis that lost them (a restart without persistence,
`FUNCTION FLUSH`) answers "Function not found" and ran nothing, so the caller loads the
library and calls again (`is_missing`).
"""

import hashlib
from functools import cache
from pathlib import Path

LUA_DIR = Path(__file__).with_name("lua")
# The quota leases' steps (docs/proposals/0001-fair-queue-on-redis-cluster.md): keyed, each
# called with the keys it touches, all of one hash slot, which a cluster routes it by.
LEASE_SCRIPTS: tuple[str, ...] = (
    *("lease_policy", "lease_grant", "lease_settle", "lease_sequences"),  # a tenant's slot
    *("lease_apply", "lease_admit", "lease_release", "lease_shrink", "lease_fence"),  # a pool's
)
# One per decision; each file in lua/ is one function of the library, one atomic step.
SCRIPT_NAMES: tuple[str, ...] = (
    *("enqueue", "pick", "release", "release_pick", "cancel", "requeue"),
    *("reap", "expire", "renew", "check", "stop_waiting", "kick", "answer", "set_load"),
    *("grow", "pool_shape"),
    *LEASE_SCRIPTS,
)


@cache
def _files() -> tuple[str, ...]:
    """lib.lua, then each script's file, in SCRIPT_NAMES order."""
    names = ("lib", *SCRIPT_NAMES)
    return tuple((LUA_DIR / f"{name}.lua").read_text() for name in names)


@cache
def library_name() -> str:
    digest = hashlib.sha1("\0".join(_files()).encode()).hexdigest()
    return f"gpushare_fq_{digest[:12]}"


def function_name(script: str) -> str:
    """The name a script's function is called by (FCALL) in this release's library."""
    return f"{library_name()}_{script}"


@cache
def library_source() -> str:
    """What FUNCTION LOAD takes: the shebang naming the library, lib.lua, then one function
    per script."""
    lib, *scripts = _files()
    parts = [f"#!lua name={library_name()}", lib]
    for name, body in zip(SCRIPT_NAMES, scripts, strict=True):
        if name in LEASE_SCRIPTS:
            head = "function(keys, argv)\nbegin_keyed(keys, argv)"
        else:
            head = "function(keys, argv)\nbegin(keys, argv)"
        parts.append(f"redis.register_function('{function_name(name)}', {head}\n{body}\nend)")
    return "\n".join(parts) + "\n"


def is_missing(error: Exception) -> bool:
    """Redis does not know the function: it ran nothing, and the library must be loaded."""
    return "Function not found" in str(error)


def is_loaded_already(error: Exception) -> bool:
    """Another process loaded the same library first."""
    return "already exists" in str(error)
