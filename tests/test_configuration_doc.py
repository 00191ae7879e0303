"""docs/CONFIGURATION.md lists every setting config/settings.py reads from the environment."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def documented_names(text: str) -> set[str]:
    """The variables the document names in backticks; `A_{B,C}_D` stands for A_B_D and A_C_D."""
    names: set[str] = set()
    for spelled in re.findall(r"`([A-Z][A-Z0-9_{},]*)`", text):
        parts = re.split(r"\{([A-Z0-9_,]+)\}", spelled)
        choices = [part.split(",") if i % 2 else [part] for i, part in enumerate(parts)]
        names.update("".join(combo) for combo in itertools.product(*choices))
    return names


def test_every_setting_read_from_the_environment_is_documented():
    settings = (REPO / "config" / "settings.py").read_text()
    read = set(re.findall(r'env_(?:str|int|float|bool|list)\(\s*"([A-Z0-9_]+)"', settings))
    assert len(read) > 50
    missing = read - documented_names((REPO / "docs" / "CONFIGURATION.md").read_text())
    assert not missing, sorted(missing)


def test_brace_groups_stand_for_each_name():
    assert documented_names("`A_{B,C}_D` and `E`") == {"A_B_D", "A_C_D", "E"}
