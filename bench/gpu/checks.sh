#!/bin/bash
# GPU-machine checks that are not timings of restarts (docs/benchmarks-history.md,
# "One GPU"): every TCPStore client call of the machine's torch against
# ft-launcher's agent store (and against torchrun's, as the reference); the
# CUDA context's time and memory; where a rank's start-up time goes before
# its context; a real Lightning Trainer under --restart-mode in-process.
# Run from the repository root with an ft-launcher binary at $FT; writes
# under $OUT (default /tmp/gpu-out). About 2 minutes.
set -u
OUT=${OUT:-/tmp/gpu-out}
FT=${FT:-$PWD/.gpubin/ft-launcher}
PY=${PY:-$(command -v python3)}
mkdir -p "$OUT"
exec > >(tee "$OUT/checks.log") 2>&1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
"$PY" -c 'import torch, lightning' # page cache

echo "== agent store: every TCPStore call of this torch (2 ranks, gloo)"
PROBE_OUT="$OUT/store-ft.json" PYTHON_EXEC="$PY" timeout 60 "$FT" --standalone --nproc-per-node 2 \
	bench/gpu/store_probe.py gloo
echo "== reference: the same calls against torchrun's own store"
PROBE_OUT="$OUT/store-torchrun.json" timeout 60 "$PY" -m torch.distributed.run --standalone \
	--nproc_per_node 2 bench/gpu/store_probe.py gloo

echo "== CUDA context: time and memory"
timeout 60 "$PY" bench/gpu/cuda_ctx.py
echo "== a rank's start-up before its CUDA context, call by call"
timeout 60 "$PY" bench/gpu/ctx_breakdown.py --like-example
PYTHON_EXEC="$PY" timeout 60 "$FT" --standalone --nproc-per-node 2 bench/gpu/ctx_breakdown.py --like-example 2>&1 | grep '{'
timeout 60 "$PY" bench/gpu/settings_probe.py

echo "== real Lightning Trainer, --restart-mode in-process (CPU, 2 ranks)"
L=$(mktemp -d)
PYTHON_EXEC="$PY" timeout 120 "$FT" --standalone --nproc-per-node 2 --restart-mode in-process --max-restarts 2 \
	--event-log "$L/events" bench/gpu/lightning_inprocess.py "$L" >"$L/log" 2>&1
echo "exit $?"
cat "$L/calls" "$L/result.json"
grep -c '"inprocess_notice"' "$L/events"

echo "== NCCL flight recorder at a hang (1 NCCL rank; the launcher turns the recorder on, on a GPU node)"
L=$(mktemp -d)
PYTHON_EXEC="$PY" timeout 120 "$FT" --standalone --nproc-per-node 1 --max-restarts 0 --log-dir "$L/logs" \
	--ft-rank-heartbeat-timeout 2 --ft-calculate-timeouts false --event-log "$L/events" bench/gpu/fr_probe.py >"$L/log" 2>&1
echo "exit $? (1 expected: the rank hung, no restart left)"
grep '"rank_stacks"' "$L/events" | "$PY" -c 'import json, sys
for l in sys.stdin:
    for r in json.loads(l)["ranks"]:
        print("state", r.get("state"), "| flight recorder", r.get("flight_recorder"), "|", r.get("flight_recorder_text"))
        f = r.get("flight_recorder_file")
        if f:
            import pickle  # our own file, written by torch in our rank: read by torch'"'"'s side to cross-check
            d = pickle.load(open(f, "rb"))
            e = d["entries"]
            print("torch reads it: version", d["version"], len(e), "entries; last", e[-1]["profiling_name"], e[-1]["state"])'
grep -h 'NCCL flight recorder' "$L"/logs/*/attempt_0/0/stacks.txt "$L"/logs/attempt_0/0/stacks.txt 2>/dev/null
