#!/usr/bin/env bash
# Makes sure a headless Chromium is there for the console's browser tests (tests/browser/).
# Idempotent: installs Debian's `chromium` package only when /usr/bin/chromium is missing.
# The tests drive it with Playwright for Python and never download a browser of their own.
# GPUSHARE_CHROMIUM points at another Chromium (then nothing is installed).
source "$(dirname "$0")/lib.sh"

CHROMIUM="${GPUSHARE_CHROMIUM:-/usr/bin/chromium}"

ensure_debian_executable "$CHROMIUM" /usr/bin/chromium chromium GPUSHARE_CHROMIUM

# A real start, so a broken install fails here and not in the middle of the tests.
timeout 60 "$CHROMIUM" --headless --no-sandbox --disable-gpu --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --dump-dom about:blank >/dev/null 2>&1 \
  || die "$CHROMIUM does not start headless (try: $CHROMIUM --headless --dump-dom about:blank)"

if [ -x "$PY" ] && ! "$PY" -c "import playwright.sync_api" 2>/dev/null; then
  die "the Python package 'playwright' is missing from $VENV (pip install playwright; do not run 'playwright install')"
fi
say "Chromium for the browser tests: $("$CHROMIUM" --version 2>/dev/null)"
