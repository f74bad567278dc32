#!/bin/bash
# Crash -> next training step on one GPU (docs/benchmarks.md, "One GPU (H200, torch 2.11)"):
# bench/prewarm.py side by side, torchrun (the machine's torch), ft-launcher
# cold, --prewarm, and in-process restarts, with the phases. Run from the
# repository root with an ft-launcher binary at $FT (default
# .gpubin/ft-launcher). Writes under $OUT (default /tmp/gpu-out): run.log
# (the markdown tables), gpu2.json, gpu4.json, gpu8.json (gpu1.json: one
# NCCL rank, with NCCL1=1), failed.tgz (logs
# and Python stacks of runs that failed or did not end). Every stage has a
# time limit inside $BUDGET seconds.
#
# --prewarm imports, besides torch and torch.distributed, the packages that
# the example's torch.use_deterministic_algorithms(True) pulls in on torch
# 2.x (torch._dynamo, torch._inductor, ...: about 5 s), found on the machine
# by settings_probe.py. One GPU holds one NCCL rank (NCCL refuses two ranks
# on one device), so several ranks use gloo on CUDA tensors.
#
# NVIDIA's ft_launcher runs beside them when $NVRX_PATH (default .nvrx)
# holds nvidia-resiliency-ext's source (bench/gpu/nvrx.sh assembles it from
# a checkout; the GPU image lacks only defusedxml of what its launcher
# imports); a launcher that does not start is left out and said so.
set -u
OUT=${OUT:-/tmp/gpu-out}
FT=${FT:-$PWD/.gpubin/ft-launcher}
PY=${PY:-$(command -v python3)}
BUDGET=${BUDGET:-540}
NVRX_PATH=${NVRX_PATH:-$PWD/.nvrx}
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
NVRX=(env PYTHONPATH="$NVRX_PATH" "$PY" -m nvidia_resiliency_ext.fault_tolerance.launcher)
if "${NVRX[@]}" --help >/dev/null 2>"$OUT/nvrx-help.err"; then
	echo "nvrx ft_launcher: $(cat "$NVRX_PATH/VERSION" 2>/dev/null || echo "from $NVRX_PATH")"
	NV=nvrx,
else
	echo "nvrx ft_launcher does not start, left out:"
	tail -3 "$OUT/nvrx-help.err"
	NV=
fi
# The smallest gloo-on-CUDA job under torchrun and ft-launcher: a hang here
# is the launcher's or torch's, not the example's.
for L in "$PY -m torch.distributed.run --standalone" "$FT --standalone"; do
	echo "== gloo_probe under ${L##*/}"
	PYTHON_EXEC="$PY" timeout -k 5 45 $L --nproc-per-node 2 bench/gpu/gloo_probe.py 2>&1 | grep -v "^\s*$" | tail -25
	echo "== gloo_probe exit ${PIPESTATUS[0]}"
done
B=(bench/prewarm.py --python "$PY" --torchrun "$PY -m torch.distributed.run" --nvrx "${NVRX[*]}" --ft-launcher "$FT"
	--mode late --step-sleep 0.2 --prewarm "$MODULES" --run-timeout ${RUN_TIMEOUT:-75} --keep-failed "$OUT/failed")
# torchrun (also with a store per round, torchrun-unshared) and nvrx first: a
# launcher whose run hangs is left out of the next stages. A run takes about
# 28 s (2 ranks) to 35 s (8): BUDGET=540 (a device call of timeout_s 590)
# holds 6 kinds at 2 and 4 ranks, and the 8-rank stage gets what is left.
KINDS=${KINDS:-torchrun,torchrun-unshared,${NV}inprocess-prewarm,prewarm,cold}
drop_hung() { # a launcher whose run did not end is left out of the next stages (its stacks are in failed.tgz)
	local k tag
	for k in torchrun torchrun-unshared nvrx; do
		case $k in
		nvrx) tag=nvrxft_launcher ;;
		torchrun-unshared) tag=torchrunTORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 ;;
		*) tag=$k ;;
		esac
		if grep -q "FAILED late-$tag-[0-9]*-[0-9]*: .* did not end within" "$OUT/run.log"; then
			case ",$KINDS," in *",$k,"*)
				KINDS=$(echo ",$KINDS," | sed "s/,$k,/,/; s/^,//; s/,\$//")
				echo "== $k: a run did not end; left out of the next stages" ;;
			esac
		fi
	done
}
for n in 2 4 8; do
	stage "$n ranks (gloo, CUDA tensors)" $((150 + 10 * n)) "$PY" "${B[@]}" --nproc $n --reps 1 --kinds "$KINDS" \
		--train-args "--device cuda --hidden 1024" --json "$OUT/gpu$n.json"
	drop_hung
done
[ "${NCCL1:-0}" = 1 ] && stage "1 rank, NCCL" 110 "$PY" "${B[@]}" --nproc 1 --reps 1 \
	--kinds "torchrun,${NV}cold,prewarm" --train-args "--device cuda --backend nccl --hidden 1024" \
	--json "$OUT/gpu1.json"
if [ -d "$OUT/failed" ]; then # the logs' ends here too, in case failed.tgz is too big to come back
	for f in $(find "$OUT/failed" -name '*.log' -size +0 | sort); do
		echo "==== ${f#$OUT/failed/} ($(wc -c <"$f") bytes), last 60 lines"
		tail -60 "$f"
	done >"$OUT/failed-tails.txt"
fi
[ -d "$OUT/failed" ] && tar -C "$OUT" -czf "$OUT/failed.tgz" failed && rm -rf "$OUT/failed"
echo "== done after $(($(date +%s) - T0))s"
