#!/usr/bin/env bash
# Runs bench/gpu/cuinit_probe.py REPS times with and without cuInit first,
# interleaved, each in a fresh process; one JSON line per run on stdout.
set -euo pipefail
reps=${1:-5}
py=${PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for i in $(seq "$reps"); do
  echo "cuinit $($py "$(dirname "$0")/cuinit_probe.py")"
  echo "plain  $($py "$(dirname "$0")/cuinit_probe.py" --no-cuinit)"
done
