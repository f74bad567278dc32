#!/usr/bin/env bash
# Builds ft-launcher and runs a real example job on this node: a small DDP
# training (PyTorch, gloo, CPU) with 3 ranks; rank 1 crashes once at step 25,
# ft-launcher restarts every rank, training resumes from its last checkpoint
# and finishes. Installs Debian's python3-torch first if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/deps.sh python3 python3-torch

echo "== building ft-launcher"
mkdir -p bin
go build -o bin/ ./cmd/...

work=$(mktemp -d /tmp/ft-launcher-demo.XXXXXX)
echo "== running the example job (work dir: $work)"
set +e
PYTHON_EXEC=/usr/bin/python3 bin/ft-launcher \
  --standalone --nproc-per-node 3 --max-restarts 2 \
  --event-log "$work/events.jsonl" --log-dir "$work/logs" --tee 3 \
  examples/ddp_train.py --steps 60 --ckpt-every 10 --step-sleep 0.02 \
  --ckpt-dir "$work/ckpt" --out "$work/weights.json" --crash-at-step 25 --crash-rank 1
code=$?
set -e
echo
echo "== ft-launcher exited with code $code"
echo "== event log ($work/events.jsonl):"
cut -c1-200 "$work/events.jsonl"
echo "== final weights: $(cat "$work/weights.json" 2>/dev/null || echo missing)"
exit $code
