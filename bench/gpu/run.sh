#!/bin/bash
# Crash -> next training step on one GPU (docs/benchmarks.md, "One GPU"):
# bench/prewarm.py side by side, torchrun (the machine's torch), ft-launcher
# cold, --prewarm, and in-process restarts, with the phases. Run from the
# repository root with an ft-launcher binary at $FT (default
# .gpubin/ft-launcher). Writes under $OUT (default /tmp/gpu-out): run.log
# (the markdown tables), gpu1.json, gpu2.json, gpu48.json, failed.tgz (logs
# and Python stacks of runs that failed or did not end). Every stage has a
# time limit inside $BUDGET seconds.
#
# --prewarm imports, besides torch and torch.distributed, the packages that
# the example's torch.use_deterministic_algorithms(True) pulls in on torch
# 2.x (torch._dynamo, torch._inductor, ...: about 5 s), found on the machine
# by settings_probe.py. One GPU holds one NCCL rank (NCCL refuses two ranks
# on one device), so several ranks use gloo on CUDA tensors.
set -u
OUT=${OUT:-/tmp/gpu-out}
FT=${FT:-$PWD/.gpubin/ft-launcher}
PY=${PY:-$(command -v python3)}
BUDGET=${BUDGET:-480}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
T0=$(date +%s)
export PYTHONUNBUFFERED=1

stage() { # NAME SECONDS CMD...: run CMD with SIGINT at min(SECONDS, what is left)
	local name=$1 secs=$2
	shift 2
	local left=$((BUDGET - ($(date +%s) - T0)))
	((secs > left)) && secs=$left
	if ((secs < 30)); then
		echo "== $name: skipped, ${left}s left of ${BUDGET}s"
		return
	fi
	echo "== $name (limit ${secs}s, at $(($(date +%s) - T0))s)"
	timeout -s INT -k 20 "$secs" "$@"
	echo "== $name: exit $? after $(($(date +%s) - T0))s"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
"$PY" bench/gpu/settings_probe.py >"$OUT/settings.txt" 2>&1 # also warms the page cache
EXTRA=$(sed -n 's/^PREWARM_EXTRA=//p' "$OUT/settings.txt")
MODULES=torch,torch.distributed${EXTRA:+,$EXTRA}
echo "--prewarm $MODULES"
B=(bench/prewarm.py --python "$PY" --torchrun "$PY -m torch.distributed.run" --ft-launcher "$FT"
	--mode late --step-sleep 0.2 --prewarm "$MODULES" --run-timeout 90 --keep-failed "$OUT/failed")
stage "2 ranks (gloo, CUDA tensors)" 240 "$PY" "${B[@]}" --nproc 2 --reps 2 \
	--kinds torchrun,cold,prewarm,inprocess,inprocess-prewarm --train-args "--device cuda --hidden 1024" \
	--json "$OUT/gpu2.json"
stage "1 rank, NCCL" 110 "$PY" "${B[@]}" --nproc 1 --reps 1 \
	--kinds torchrun,cold,prewarm --train-args "--device cuda --backend nccl --hidden 1024" \
	--json "$OUT/gpu1.json"
stage "4 and 8 ranks (gloo, CUDA tensors)" 200 "$PY" "${B[@]}" --nproc 4,8 --reps 1 \
	--kinds torchrun,prewarm,inprocess-prewarm --train-args "--device cuda --hidden 1024" \
	--json "$OUT/gpu48.json"
[ -d "$OUT/failed" ] && tar -C "$OUT" -czf "$OUT/failed.tgz" failed && rm -rf "$OUT/failed"
echo "== done after $(($(date +%s) - T0))s"
