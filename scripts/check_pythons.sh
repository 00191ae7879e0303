#!/usr/bin/env bash
# Checks that the platform installs and loads on each Python that pyproject.toml allows
# besides the development one (3.11): for each of 3.12 and 3.13, a throwaway virtual
# environment, `pip install .` (the platform alone: the vLLM engine has an environment of its
# own), then, outside the checkout so that the installed copy is the one imported,
# `django.setup()`, an import of every module of every package, and Django's system checks.
#
#   scripts/check_pythons.sh            # 3.12 and 3.13
#   scripts/check_pythons.sh 3.13       # only these
#
# Each Python is looked for as pythonX.Y on PATH, then under pyenv's versions; one that is
# not found is reported and left out (exit 0), one that fails to install or load fails the
# script. pip's wheel cache is kept, so a second run downloads nothing.
source "$(dirname "$0")/lib.sh"

find_python() {
  # pyenv's shims are on PATH even for a version that is not selected: run each candidate.
  local version="$1" candidate
  for candidate in "$(command -v "python$version" || true)" \
    $(ls -d "$(pyenv root 2>/dev/null)/versions/$version".*/bin/python 2>/dev/null | sort -rV); do
    if [ -n "$candidate" ] && "$candidate" -c "import venv" >/dev/null 2>&1; then
      echo "$candidate"
      return
    fi
  done
  return 1
}

versions=("$@")
[ "${#versions[@]}" -gt 0 ] || versions=(3.12 3.13)

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# A copy of what `pip install .` reads: setuptools builds in the source folder (build/,
# *.egg-info), which would leave them in the checkout.
mkdir "$work/src"
tar -C "$REPO_ROOT" --exclude=__pycache__ -cf - pyproject.toml api audit billing capacity config console \
  fairqueue plumbing portal protocol scheduler staff telemetry tenants tracing workers \
  | tar -C "$work/src" -xf -

for version in "${versions[@]}"; do
  if ! python="$(find_python "$version")"; then
    say "Python $version: not found (pythonX.Y on PATH or pyenv), left out"
    continue
  fi
  say "Python $version: $python"
  venv="$work/venv-$version"
  "$python" -m venv "$venv" || die "Python $version: venv failed"
  "$venv/bin/pip" install -qq --disable-pip-version-check "$work/src" \
    || die "Python $version: pip install . failed"
  (
    cd "$work"
    export DJANGO_SETTINGS_MODULE=config.settings
    export GPUSHARE_VAR_DIR="$work/var-$version"
    export DJANGO_SECRET_KEY="check-pythons-only-not-a-real-key-0123456789abcdefghijklmnop"
    mkdir -p "$GPUSHARE_VAR_DIR/static"
    "$venv/bin/python" - <<'EOF'
import importlib
import pkgutil
import sys

import django

django.setup()

names = []
for package in (
    "api", "capacity", "config", "console", "fairqueue", "plumbing", "protocol", "scheduler",
    "staff", "telemetry", "tenants", "tracing", "workers",
):
    module = importlib.import_module(package)
    assert "site-packages" in module.__file__, module.__file__  # the installed copy
    names.append(package)
    for info in pkgutil.walk_packages(module.__path__, prefix=f"{package}."):
        importlib.import_module(info.name)
        names.append(info.name)
print(f"Python {sys.version.split()[0]}: Django {django.__version__}, {len(names)} modules import")
EOF
    # Errors fail; the warning that the checkout's static/ is not beside the installed
    # package is expected (the image copies it).
    "$venv/bin/python" -m django check
  ) || die "Python $version: the platform does not load"
done
say "Every Python checked loads the platform"
