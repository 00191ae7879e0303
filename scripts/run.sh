#!/usr/bin/env bash
# `make run`: the whole platform on this machine with its embedded defaults:
# SQLite (unless DATABASE_URL is set), local Redis, a Celery worker and beat, the engine
# agent (agent/: the process that starts, drains and checks the engines; it writes their
# logs to var/log/agent.log too), a vLLM CPU engine serving the tiny demo model, and the web.
source "$(dirname "$0")/lib.sh"
"$REPO_ROOT/scripts/bootstrap.sh"
cd "$REPO_ROOT"
export GPUSHARE_VLLM_PYTHON="${GPUSHARE_VLLM_PYTHON:-$("$REPO_ROOT/scripts/engine_setup.sh" | tail -1)}"
[ -x "$GPUSHARE_VLLM_PYTHON" ] || die "no vLLM environment (scripts/engine_setup.sh failed)"
ENGINE="${GPUSHARE_DEMO_ENGINE:-demo}"
ENGINE_PORT="${GPUSHARE_DEMO_ENGINE_PORT:-8100}"

HOST="${GPUSHARE_HOST:-127.0.0.1}"
PORT="${GPUSHARE_PORT:-8000}"
LOG_DIR="${GPUSHARE_VAR_DIR:-$REPO_ROOT/var}/log"
mkdir -p "$LOG_DIR"

say "Applying database migrations"
"$PY" manage.py migrate --noinput >/dev/null || die "migrations failed"
"$PY" manage.py collectstatic --noinput >/dev/null || die "collectstatic failed"

# Each process of the platform runs in a session of its own (`setsid`): Ctrl-C (SIGINT to the
# terminal's foreground process group) and a closed terminal (SIGHUP) reach this script only,
# which stops them in order: the engine drains through the agent while the agent is still
# there to drain it, then the rest. A process still there STOP_GRACE_S after SIGTERM is killed.
STOP_GRACE_S=20
children=()
start() {
  setsid "$@" &
  children+=($!)
}
stop_all() {
  trap - INT TERM HUP EXIT
  say "Stopping (the engine drains first)" 2>/dev/null || true  # the terminal may be gone
  timeout 60 "$PY" manage.py engine stop "$ENGINE" >/dev/null 2>&1 || true
  for pid in "${children[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq $((STOP_GRACE_S * 5))); do
    alive=0
    for pid in "${children[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" -eq 0 ] && break
    sleep 0.2
  done
  for pid in "${children[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap 'stop_all; exit 0' INT TERM HUP
trap stop_all EXIT

say "Starting a Celery worker (log: var/log/worker.log)"
start "$VENV/bin/celery" -A config worker --pool threads --concurrency "${GPUSHARE_WORKER_THREADS:-8}" \
  --without-gossip --without-mingle --without-heartbeat --loglevel INFO >"$LOG_DIR/worker.log" 2>&1
say "Starting the engine agent (starts, drains and checks engines; log: var/log/agent.log)"
start "$PY" -m agent >"$LOG_DIR/agent.log" 2>&1
say "Starting Celery beat (log: var/log/beat.log)"
# In a JSON log (GPUSHARE_LOG_FORMAT=json) beat prints no banner: each line is a JSON object.
quiet=()
[ "${GPUSHARE_LOG_FORMAT:-plain}" = json ] && quiet=(--quiet)
start "$VENV/bin/celery" "${quiet[@]}" -A config beat --loglevel INFO >"$LOG_DIR/beat.log" 2>&1

say "Registering this machine's devices and the demo engine"
"$PY" manage.py gpus discover || die "device discovery failed"
"$PY" manage.py engine create "$ENGINE" --port "$ENGINE_PORT" --max-model-len 2048 \
  --max-num-seqs 16 --if-missing || die "could not register the demo engine"
say "Starting the demo engine (vLLM CPU, about a minute; log: var/engines/$ENGINE.log)"
"$PY" manage.py engine start "$ENGINE" || die "the demo engine did not start (see var/engines/$ENGINE.log)"

"$PY" manage.py demo --base-url "http://$HOST:$PORT" || die "demo set-up failed"

say "Serving on http://$HOST:$PORT (Ctrl-C stops everything)"
start "$PY" -m plumbing.serve config.asgi:application --host "$HOST" --port "$PORT" --log-level info
wait -n "${children[@]}" || true
die "a platform process exited (logs in var/log/)"
