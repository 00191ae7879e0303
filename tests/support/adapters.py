"""LoRA adapters for the demo model, as scripts/make_tiny_adapters.py writes them: shared by
the adapters' tests and bench/lora.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_tiny_adapters.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_tiny_adapters", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_adapter(folder: Path, name: str) -> Path:
    """Writes the demo model's adapter `name` (seeded by its name) into `folder`/`name`."""
    _script().write_adapter(folder / name, name)
    return folder / name
