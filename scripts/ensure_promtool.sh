#!/usr/bin/env bash
# Makes sure promtool is there for the alert rules' unit tests (tests/test_metrics_rules.py
# runs `promtool test rules platform/prometheus/rules_test.yml`). Idempotent: installs
# Debian's `prometheus` package, which ships promtool, only when promtool is missing.
# GPUSHARE_PROMTOOL points at another promtool (then nothing is installed).
source "$(dirname "$0")/lib.sh"

PROMTOOL="${GPUSHARE_PROMTOOL:-/usr/bin/promtool}"

ensure_debian_executable "$PROMTOOL" /usr/bin/promtool prometheus GPUSHARE_PROMTOOL
say "promtool for the alert rules' tests: $("$PROMTOOL" --version 2>&1 | head -1)"
