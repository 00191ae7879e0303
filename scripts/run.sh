#!/usr/bin/env bash
# `make run`: the whole platform on this machine with its embedded defaults:
# SQLite (unless DATABASE_URL is set), local Redis, a Celery worker and beat, the web app.
source "$(dirname "$0")/lib.sh"
"$REPO_ROOT/scripts/bootstrap.sh"
cd "$REPO_ROOT"

HOST="${GPUSHARE_HOST:-127.0.0.1}"
PORT="${GPUSHARE_PORT:-8000}"
LOG_DIR="$REPO_ROOT/var/log"
mkdir -p "$LOG_DIR"

say "Applying database migrations"
"$PY" manage.py migrate --noinput >/dev/null || die "migrations failed"
"$PY" manage.py collectstatic --noinput >/dev/null || die "collectstatic failed"

children=()
stop_all() {
  trap - INT TERM EXIT
  say "Stopping"
  for pid in "${children[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop_all INT TERM EXIT

say "Starting a Celery worker (log: var/log/worker.log)"
"$VENV/bin/celery" -A config worker --pool threads --concurrency "${GPUSHARE_WORKER_THREADS:-8}" \
  --loglevel INFO >"$LOG_DIR/worker.log" 2>&1 &
children+=($!)
say "Starting Celery beat (log: var/log/beat.log)"
"$VENV/bin/celery" -A config beat --loglevel INFO \
  --schedule "$REPO_ROOT/var/celerybeat-schedule" >"$LOG_DIR/beat.log" 2>&1 &
children+=($!)

"$PY" manage.py demo --base-url "http://$HOST:$PORT" || die "demo set-up failed"

say "Serving on http://$HOST:$PORT (Ctrl-C stops everything)"
"$VENV/bin/uvicorn" config.asgi:application --host "$HOST" --port "$PORT" --log-level info &
children+=($!)
wait -n "${children[@]}" || true
die "a platform process exited (logs in var/log/)"
