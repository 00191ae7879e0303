# Shared by the scripts behind `make run` and `make test`: say what is happening, fail clearly.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GPUSHARE_VENV:-$REPO_ROOT/.venv}"
PY="$VENV/bin/python"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/0}"

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }
die() { printf '\033[31mERROR: %s\033[0m\n' "$*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@";
  else die "need root to run: $* (install it yourself, or run as root)"; fi
}

apt_install() {
  command -v apt-get >/dev/null || die "apt-get not found: install $* yourself"
  say "Installing $* from Debian's packages"
  as_root apt-get update -qq || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null \
    || die "apt-get install $* failed"
}

# Makes sure the executable PATH is there. PATH is either DEFAULT, Debian's PACKAGE's own
# file, installed when missing; or what the environment variable VAR pointed at instead,
# which must exist already.
ensure_debian_executable() {
  local path="$1" default="$2" package="$3" var="$4"
  [ -x "$path" ] && return 0
  [ "$path" = "$default" ] || die "$var=$path is not an executable file"
  apt_install "$package"
  [ -x "$path" ] || die "installed the $package package but $path is still missing"
}
