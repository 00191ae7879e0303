#!/bin/sh
# A GPU node's container: record this node's GPUs (pynvml) under GPUSHARE_NODE_NAME, then run
# the given command (the Celery worker, which also consumes gpushare.node.<node name>, where
# the scaler sends this node's engine starts and drains).
set -eu
: "${GPUSHARE_NODE_NAME:?set GPUSHARE_NODE_NAME to this node's name}"
python manage.py gpus discover
exec "$@"
