"""The platform's processes are not dumpable: another process of the same user cannot read
their environment or memory.

Every process of the platform holds its secrets (DJANGO_SECRET_KEY, DATABASE_URL with its
password, REDIS_URL) in its environment and memory, and an engine the agent starts runs
tenants' requests. Linux lets a process read another's /proc/<pid>/environ and /proc/<pid>/mem
(and attach a debugger to it) when both run as one user, unless the target has cleared its
"dumpable" flag with prctl(PR_SET_DUMPABLE, 0): then only a process with CAP_SYS_PTRACE
(root) may, and the kernel writes no core dump of it. The flag is the process's own and is
set again by execve, so the engines the agent starts are not affected by it, nor is anything
else the platform runs.

The settings clear it as they load (GPUSHARE_DUMPABLE), so web, workers, beat, the agent and
manage.py commands all do. What it costs: a same-user debugger or profiler (py-spy, gdb)
cannot attach unless run as root, or with GPUSHARE_DUMPABLE=true.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4


def _prctl(option: int, arg: int = 0) -> int:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    result: int = libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0)
    if result < 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")
    return result


def forbid_dumps() -> bool:
    """Clears this process's dumpable flag; True where it is clear now (Linux), False on a
    system without prctl."""
    if not sys.platform.startswith("linux"):
        return False
    _prctl(PR_SET_DUMPABLE, 0)
    return True


def is_dumpable() -> bool | None:
    """The flag as the kernel has it; None on a system without prctl."""
    if not sys.platform.startswith("linux"):
        return None
    return _prctl(PR_GET_DUMPABLE) != 0
