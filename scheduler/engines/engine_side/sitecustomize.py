"""Run by every Python process of an engine at its start (the engine's PYTHONPATH is this
folder, and Python imports `sitecustomize` from it), vLLM's worker processes included.

It asks Linux for the AMX tile state where the CPU has one. vLLM's CPU attention takes its AMX
kernel wherever the CPU has AMX and the KV cache is bfloat16, and Linux kills a process that
runs a tile instruction without having asked (SIGILL). A compiled model asks on its way; an
engine that runs eagerly, as one serving LoRA adapters does, never does. Elsewhere the call
fails, and nothing else happens.
"""

import ctypes
import platform

SYS_ARCH_PRCTL = 158  # x86-64
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


def ask_for_amx_tiles() -> None:
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return
    try:
        ctypes.CDLL(None, use_errno=True).syscall(
            SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
        )
    except (OSError, AttributeError):  # no libc to call: nothing to ask
        return


ask_for_amx_tiles()
