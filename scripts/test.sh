#!/usr/bin/env bash
# `make test`: lint, type-check and run the whole test suite against real services.
# Uses PostgreSQL when DATABASE_URL is set (CI sets it), else a SQLite file; Redis at REDIS_URL.
# Extra arguments go to pytest, e.g. `make test ARGS="-k fairqueue"`.
source "$(dirname "$0")/lib.sh"
"$REPO_ROOT/scripts/bootstrap.sh"
cd "$REPO_ROOT"

say "ruff"
"$VENV/bin/ruff" check . || die "ruff found problems"
"$VENV/bin/ruff" format --check . >/dev/null || die "ruff format: run '.venv/bin/ruff format .'"
say "mypy"
"$VENV/bin/mypy" . || die "mypy found problems"
say "import contracts"
"$VENV/bin/lint-imports" || die "an import breaks a contract in pyproject.toml [tool.importlinter]"
# End-to-end tests run a real vLLM CPU engine on the tiny demo model.
export GPUSHARE_VLLM_PYTHON="${GPUSHARE_VLLM_PYTHON:-$("$REPO_ROOT/scripts/engine_setup.sh" | tail -1)}"
# Browser tests drive the console in Debian's headless Chromium.
"$REPO_ROOT/scripts/ensure_chromium.sh"
# The alert rules' unit tests run in Debian's promtool.
"$REPO_ROOT/scripts/ensure_promtool.sh"
say "pytest (database: ${DATABASE_URL:-SQLite})"
if [ "$#" -gt 0 ]; then
  exec "$VENV/bin/pytest" "$@"
fi
# The reliability suite starts platforms of its own and kills their parts: it runs on its own,
# after the end-to-end suite's platform is gone.
"$VENV/bin/pytest" --ignore=tests/reliability
say "pytest tests/reliability"
"$VENV/bin/pytest" tests/reliability
