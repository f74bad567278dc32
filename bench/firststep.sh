#!/bin/bash
# The first cycle's start-up, side by side: bench/goodput.py's job (2 nodes
# x 2 ranks and a spare on loopback, torch 1.13) run for a few seconds with
# no fault, launcher start to rank 0's first step, in turns:
#   known  --prewarm auto, the command line learned (a warm-up run first)
#   first  --prewarm auto, a fresh state file (nothing learned: cold)
#   off    no --prewarm
# Usage: bash bench/firststep.sh [REPS] [OUT]   (docs/prewarm.md, "The first cycle")
set -euo pipefail
reps=${1:-3}
out=${2:-/tmp/firststep-$(date +%s)}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
known_state="$out/state-known"
run() { # kind rep
	local kind=$1 rep=$2 state prewarm=auto
	case $kind in
	known) state=$known_state ;;
	first) state=$(mktemp -d "$out/state-first-XXXX") ;;
	off) state=$(mktemp -d "$out/state-off-XXXX"); prewarm=off ;;
	esac
	XDG_STATE_HOME=$state /usr/bin/python3 "$here/bench/goodput.py" --launchers ft --ft-prewarm "$prewarm" \
		--duration 12 --interval 60 --out "$out/$kind-$rep" >"$out/$kind-$rep.log" 2>&1
	/usr/bin/python3 - "$out/$kind-$rep/ft" "$kind" <<'PY'
import json, os, sys
d, kind = sys.argv[1], sys.argv[2]
t0 = json.load(open(os.path.join(d, "campaign.json")))["t0"]
b = next(l for l in open(os.path.join(d, "steps-rank0.log")) if l.startswith("B")).split()
print(f"{kind}\t{float(b[4]) - t0:.2f}")
PY
	sleep 3
}
# Warm-up: teaches the known state file the job's modules (its own start-up is not counted).
XDG_STATE_HOME=$known_state /usr/bin/python3 "$here/bench/goodput.py" --launchers ft --duration 12 --interval 60 \
	--out "$out/warmup" >"$out/warmup.log" 2>&1
sleep 3
for rep in $(seq "$reps"); do
	for kind in known first off; do
		run "$kind" "$rep"
	done
done | tee "$out/firststep.tsv"
