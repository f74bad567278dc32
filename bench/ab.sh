#!/bin/bash
# bench/ab.sh OLD [NEW] [ROUNDS]: the CPU benchmarks of two trees, run
# alternately in one sitting (old, new, old, new...), so that a refactor
# can show that it changed nothing beyond noise (docs/benchmarks.md,
# "Before and after a refactor"). OLD and NEW are git revisions (NEW
# defaults to HEAD); each round runs, for each tree:
#   - one node, 2 ranks of examples/ddp_train.py: crash -> next step with
#     --prewarm and with --restart-mode in-process (bench/prewarm.py);
#   - 4 launchers on loopback: a rank crash, a node loss and a spare swap
#     (bench/multinode.py, no torchrun);
#   - rank monitors: 200 hangs, timeout expiry -> SIGKILL (monbench);
#   - the Python client's state save/load, 256 MiB (bench/state_bench.py,
#     each tree's own client).
# Output: one file per tree, round and benchmark under $AB_OUT
# (default /tmp/ab), and the load average before each run.
set -euo pipefail
old=${1:?usage: bench/ab.sh OLD [NEW] [ROUNDS]}
new=${2:-HEAD}
rounds=${3:-3}
out=${AB_OUT:-/tmp/ab}
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
for side in old new; do
	rev=$old
	[ $side = new ] && rev=$new
	rm -rf "$out/$side"
	git -C "$repo" worktree add -q --detach "$out/$side" "$rev"
	(cd "$out/$side" && go build -o "$out/$side/bin/" ./cmd/... && go build -o "$out/$side/bin/monbench" ./bench/monitor/monbench)
	git -C "$repo" rev-parse --short "$rev" > "$out/$side/REV"
done
trap 'for s in old new; do git -C "$repo" worktree remove --force "$out/$s" 2>/dev/null || true; done' EXIT
for r in $(seq "$rounds"); do
	for side in old new; do
		t=$out/$side
		f=$out/r$r-$side
		echo "$(date -u +%T) round $r $side ($(cat "$t/REV")) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/log"
		(cd /tmp && /usr/bin/python3 "$t/bench/prewarm.py" --ft-launcher "$t/bin/ft-launcher" --reps 2 --nproc 2 \
			--inprocess --kinds prewarm,inprocess-prewarm --json "$f-restart.json") > "$f-restart.txt" 2>&1 || echo "restart bench failed" >> "$out/log"
		/usr/bin/python3 "$t/bench/multinode.py" --bin-dir "$t/bin" --torchrun "" --only crash,nodeloss,swap --reps 2 \
			> "$f-multinode.txt" 2>&1 || echo "multinode bench failed" >> "$out/log"
		"$t/bin/monbench" hang -n 200 -par 4 -timeout 300ms > "$f-monitor.txt" 2>&1 || echo "monbench failed" >> "$out/log"
		(cd /tmp && /usr/bin/python3 "$t/bench/state_bench.py" --mib 256 --reps 3 --no-crc) > "$f-state.txt" 2>&1 || echo "state bench failed" >> "$out/log"
	done
done
echo "$(date -u +%T) done" | tee -a "$out/log"
