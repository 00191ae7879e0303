"""Where the vLLM interpreter is: the GPUSHARE_VLLM_PYTHON setting, or the newest complete
environment scripts/setup_vllm.sh built in the cache folder."""

from __future__ import annotations

import os
from pathlib import Path

COMPLETE_MARKER = ".gpushare-complete"


class VllmEnvMissing(Exception):
    pass


def find_vllm_python(*, configured: str, cache_dir: Path) -> Path:
    if configured:
        python = Path(configured).expanduser()
        if not (python.is_file() and os.access(python, os.X_OK)):
            raise VllmEnvMissing(
                f"GPUSHARE_VLLM_PYTHON={configured} is not an executable interpreter."
            )
        return python
    markers = sorted(
        cache_dir.glob(f"vllm-*/{COMPLETE_MARKER}"),
        key=lambda marker: marker.stat().st_mtime,
        reverse=True,
    )
    for marker in markers:
        python = marker.parent / "bin" / "python"
        if python.is_file():
            return python
    raise VllmEnvMissing(
        f"No vLLM environment in {cache_dir}: run scripts/setup_vllm.sh (it builds one "
        "there, once per machine) or set GPUSHARE_VLLM_PYTHON to a vLLM interpreter."
    )
