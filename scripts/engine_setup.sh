#!/usr/bin/env bash
# The vLLM CPU engine's environment (built once per machine, cached outside the checkout)
# and the tiny demo model (generated locally: no weights can be downloaded).
# Prints the vLLM interpreter path on its last line.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

say "vLLM CPU engine environment (first time: about 2 minutes and 3.5 GB)"
vllm_python="$(bash scripts/setup_vllm.sh | tail -1)" || die "scripts/setup_vllm.sh failed (see above)"
[ -x "$vllm_python" ] || die "scripts/setup_vllm.sh did not print an interpreter path"
model_dir="${GPUSHARE_DEMO_MODEL_DIR:-$REPO_ROOT/var/models/tiny-llama}"
say "Demo model in $model_dir"
"$vllm_python" scripts/make_tiny_model.py "$model_dir" >/dev/null \
  || die "scripts/make_tiny_model.py failed"
echo "$vllm_python"
