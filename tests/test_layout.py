import platform
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_platform_is_the_standard_library_module_from_the_repository_root():
    # Run from the repository root, where a platform/ package would win the import.
    code = "import platform, sys; print(platform.__file__); print(platform.system())"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    module_file, system = result.stdout.split("\n")[:2]
    assert Path(module_file).parent == Path(sysconfig.get_paths()["stdlib"])
    assert system == "Linux"


def test_platform_folder_holds_no_python_package():
    assert (REPO / "platform").is_dir()
    assert not (REPO / "platform" / "__init__.py").exists()
    assert platform.__file__ is not None
    assert not platform.__file__.startswith(str(REPO))


def test_the_layout_of_the_design_is_there():
    for path in (
        "manage.py",
        "pyproject.toml",
        "config/settings.py",
        "config/urls.py",
        "config/asgi.py",
        "config/wsgi.py",
        "config/celery.py",
        "api",
        "capacity",
        "console",
        "fairqueue",
        "plumbing",
        "portal",
        "protocol",
        "scheduler/engines",
        "scheduler/online",
        "scheduler/batches/feeder.py",
        "scheduler/pools",
        "staff",
        "telemetry",
        "tenants",
        "tracing",
        "workers",
        "templates",
        "tests",
    ):
        assert (REPO / path).exists(), path
