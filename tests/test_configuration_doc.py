"""docs/CONFIGURATION.md lists every setting the platform reads from the environment.

The application's packages are found by walking the repository for folders that hold an
`__init__.py` (all but tests/, bench/, scripts/ and hidden or local folders), so the check
follows modules wherever they move. A name counts as read where the source passes it, as a
literal, to an `env_*` helper (`env_str`, `env_int`, ...), to `os.environ.get`,
`os.environ.setdefault`, `os.environ[...]`, `os.getenv` or an `in os.environ` test. The
shell scripts behind `make run` and `make test` count too, where they read `${NAME:-...}`.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "CONFIGURATION.md"
NOT_APPLICATION = {"tests", "bench", "scripts", "var", "node_modules", "static", "templates"}
ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*\Z")


def documented_names(text: str) -> set[str]:
    """The variables the document names in backticks; `A_{B,C}_D` stands for A_B_D and A_C_D."""
    names: set[str] = set()
    for spelled in re.findall(r"`([A-Z][A-Z0-9_{},]*)`", text):
        parts = re.split(r"\{([A-Z0-9_,]+)\}", spelled)
        choices = [part.split(",") if i % 2 else [part] for i, part in enumerate(parts)]
        names.update("".join(combo) for combo in itertools.product(*choices))
    return names


def application_sources(root: Path = REPO) -> Iterator[Path]:
    """Every Python file of the application's packages, and the modules at the root."""
    yield from sorted(root.glob("*.py"))
    for top in sorted(root.iterdir()):
        if not top.is_dir() or top.name.startswith((".", "_")) or top.name in NOT_APPLICATION:
            continue
        packages = {init.parent for init in top.rglob("__init__.py")}
        for package in sorted(packages):
            yield from sorted(package.glob("*.py"))


def _is_environ(node: ast.expr) -> bool:
    """`os.environ`, or `environ` imported from os."""
    if isinstance(node, ast.Attribute):
        return node.attr == "environ"
    return isinstance(node, ast.Name) and node.id == "environ"


def _literal(node: ast.expr | None) -> str | None:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and ENV_NAME.match(node.value)
    ):
        return node.value
    return None


def _name_read(node: ast.AST) -> str | None:
    """The variable one node of a module's syntax tree reads, if it reads one."""
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        by_helper = called.startswith("env_") or called == "getenv"
        by_environ = (
            isinstance(func, ast.Attribute)
            and _is_environ(func.value)
            and func.attr in {"get", "setdefault", "pop"}
        )
        return _literal(node.args[0]) if by_helper or by_environ else None
    if isinstance(node, ast.Subscript) and _is_environ(node.value):
        return _literal(node.slice)
    if (
        isinstance(node, ast.Compare)
        and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
        and any(_is_environ(right) for right in node.comparators)
    ):
        return _literal(node.left)
    return None


def names_read(source: str) -> set[str]:
    """The environment variables a module's source reads, by name."""
    return {name for node in ast.walk(ast.parse(source)) if (name := _name_read(node))}


def names_read_by_scripts(text: str) -> set[str]:
    """`${NAME:-default}`, `${NAME-default}` and `${NAME:?message}` in a shell script."""
    return set(re.findall(r"\$\{([A-Z][A-Z0-9_]*):?[-?=]", text))


def read_from_environment() -> dict[str, set[str]]:
    """Each name read, and the files that read it."""
    read: dict[str, set[str]] = {}
    for path in application_sources():
        for name in names_read(path.read_text()):
            read.setdefault(name, set()).add(str(path.relative_to(REPO)))
    for path in sorted((REPO / "scripts").glob("*.sh")) + sorted(REPO.glob("platform/*.sh")):
        for name in names_read_by_scripts(path.read_text()):
            read.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return read


def test_every_setting_read_from_the_environment_is_documented():
    read = read_from_environment()
    # The settings module alone reads more than 50: a scan that finds fewer is broken.
    assert len(read) > 60, sorted(read)
    missing = {
        name: sorted(files)
        for name, files in read.items()
        if name not in documented_names(DOC.read_text())
    }
    assert not missing, f"not in docs/CONFIGURATION.md: {missing}"


def test_the_scan_covers_every_application_package():
    scanned = {path.relative_to(REPO).parts[0] for path in application_sources()}
    assert {"config", "scheduler", "tenants", "workers"} <= scanned
    assert not scanned & {"tests", "bench", "scripts", ".venv"}


def test_a_package_that_moves_is_still_scanned(tmp_path: Path):
    for folder in ("plumbing/redis", "tests", "bench", ".venv/lib/site"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "__init__.py").write_text("")
        (tmp_path / folder / "clients.py").write_text("")
    (tmp_path / "manage.py").write_text("")
    found = {str(path.relative_to(tmp_path)) for path in application_sources(tmp_path)}
    assert found == {
        "manage.py",
        "plumbing/redis/__init__.py",
        "plumbing/redis/clients.py",
    }


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('env_int("GPUSHARE_A", 1)', {"GPUSHARE_A"}),
        ('env.env_str("GPUSHARE_B", "")', {"GPUSHARE_B"}),
        ('os.environ.get("DATABASE_URL")', {"DATABASE_URL"}),
        ('os.environ["REDIS_URL"]', {"REDIS_URL"}),
        ('os.getenv("DJANGO_X", "y")', {"DJANGO_X"}),
        (
            'environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")',
            {"DJANGO_SETTINGS_MODULE"},
        ),
        ('"GPUSHARE_C" in os.environ', {"GPUSHARE_C"}),
        ('settings.get("GPUSHARE_D")', set()),
        ("os.environ.get(name)", set()),
    ],
)
def test_names_read_finds_each_way_of_reading(source: str, expected: set[str]):
    assert names_read(source) == expected


def test_names_read_by_scripts():
    text = 'PORT="${GPUSHARE_PORT:-8000}" "${X_Y:?set it}" "${HOME}" "${PYTHON:-}"'
    assert names_read_by_scripts(text) == {"GPUSHARE_PORT", "X_Y", "PYTHON"}


def test_brace_groups_stand_for_each_name():
    assert documented_names("`A_{B,C}_D` and `E`") == {"A_B_D", "A_C_D", "E"}
