"""Every Python process of an engine asks Linux for the AMX tile state where the CPU has one
(engine_side/sitecustomize.py): vLLM's CPU attention runs tile instructions there, and an
engine that runs eagerly (LoRA) died of SIGILL at its first request
(tests/e2e/test_lora.py runs one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from scheduler.engines.launch import ENGINE_SIDE_DIR

# ARCH_GET_XCOMP_PERM: the extended states this process may use, as a bit mask.
PERMITTED = """
import ctypes, sitecustomize
bits = ctypes.c_uint64()
ctypes.CDLL(None).syscall(158, 0x1022, ctypes.byref(bits))
print(sitecustomize.__file__, bits.value >> 18 & 1)
"""


def test_a_process_on_the_engines_path_may_use_amx_tiles_where_the_cpu_has_them() -> None:
    env = {**os.environ, "PYTHONPATH": str(ENGINE_SIDE_DIR)}
    result = subprocess.run([sys.executable, "-c", PERMITTED], env=env, capture_output=True,
                            text=True, check=True, timeout=60)  # fmt: skip
    path, granted = result.stdout.split()
    assert Path(path).parent == ENGINE_SIDE_DIR
    has_amx = " amx_tile " in f" {Path('/proc/cpuinfo').read_text().replace(chr(10), ' ')} "
    assert granted == ("1" if has_amx else "0")
