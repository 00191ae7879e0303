#!/usr/bin/env bash
# Makes a fresh Debian/Ubuntu checkout ready: Python 3.11 venv with the platform's packages,
# and a Redis server answering at REDIS_URL. Safe to run again: it only does what is missing.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

find_python() {
  for candidate in "${PYTHON:-}" python3.11 python3; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null \
       && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      echo "$candidate"; return
    fi
  done
}

ensure_venv() {
  local python; python="$(find_python)"
  if [ -z "$python" ]; then
    apt_install python3.11 python3.11-venv
    python="$(find_python)"
    [ -n "$python" ] || die "Python 3.11 is required (Django 5.2 LTS, vLLM CPU build)"
  fi
  if [ ! -x "$PY" ]; then
    say "Creating the virtual environment in $VENV"
    "$python" -m venv "$VENV" 2>/dev/null || { apt_install python3.11-venv; "$python" -m venv "$VENV"; } \
      || die "could not create a virtual environment with $python"
  fi
  # Reinstall only when pyproject.toml changed since the last successful install.
  local stamp="$VENV/.gpushare-installed" want
  want="$(sha256sum pyproject.toml | cut -c1-16)"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "Installing Python packages (pyproject.toml)"
    "$PY" -m pip install -q --upgrade pip >/dev/null || die "could not upgrade pip"
    "$PY" -m pip install -q -e '.[dev]' || die "pip install -e '.[dev]' failed (see above)"
    echo "$want" > "$stamp"
  fi
}

redis_answers() {
  "$PY" - "$REDIS_URL" <<'PYEOF' 2>/dev/null
import sys, redis
redis.Redis.from_url(sys.argv[1], socket_connect_timeout=1).ping()
PYEOF
}

ensure_redis() {
  redis_answers && return
  command -v redis-server >/dev/null || apt_install redis-server
  local port; port="$("$PY" -c "import sys; from urllib.parse import urlparse; print(urlparse(sys.argv[1]).port or 6379)" "$REDIS_URL")"
  say "Starting redis-server on 127.0.0.1:$port"
  mkdir -p "$REPO_ROOT/var/redis"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
    --dir "$REPO_ROOT/var/redis" --logfile "$REPO_ROOT/var/redis/redis.log" \
    || die "redis-server did not start (see var/redis/redis.log)"
  for _ in $(seq 20); do redis_answers && return; sleep 0.25; done
  die "redis-server started but does not answer at $REDIS_URL"
}

mkdir -p var
ensure_venv
ensure_redis
