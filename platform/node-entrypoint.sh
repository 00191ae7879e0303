#!/bin/sh
# A GPU node's engine agent container: record this node's GPUs (pynvml) under
# GPUSHARE_NODE_NAME, then run the given command (`python -m agent`, which consumes
# gpushare.node.<node name>, where the console and the scaler send this node's engine starts
# and drains).
set -eu
: "${GPUSHARE_NODE_NAME:?set GPUSHARE_NODE_NAME to this node's name}"
python manage.py gpus discover
exec "$@"
