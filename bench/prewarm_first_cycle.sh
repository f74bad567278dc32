#!/bin/bash
# The first cycle's cost of --prewarm: launch -> the last rank's first
# training step (rank_first_step in the event log) of a standalone job,
# 4 ranks of examples/ddp_train.py (20 steps), for each binary directory
# given with --prewarm auto, then the last one without --prewarm.
# Runs alternate; prints one line per run.
#   bash bench/prewarm_first_cycle.sh REPS BINDIR...
# e.g. bash bench/prewarm_first_cycle.sh 8 /tmp/bold /tmp/bnew
set -u
reps=$1; shift
repo=$(cd "$(dirname "$0")/.." && pwd)
run() { # bindir prewarm(auto|off)
  local d pw rc fs
  d=$(mktemp -d /tmp/ftl-first-cycle-XXXX)
  pw=(); [ "$2" = auto ] && pw=(--prewarm auto)
  (cd "$repo" && PYTHON_EXEC=/usr/bin/python3 "$1/ft-launcher" --standalone --nproc-per-node 4 "${pw[@]}" \
     --event-log "$d/ev.jsonl" examples/ddp_train.py --steps 20 --ckpt-dir "$d/ck" --out "$d/out.json" >"$d/log" 2>&1)
  rc=$?
  fs=$(/usr/bin/python3 - "$d/ev.jsonl" <<'PY'
import datetime, json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
t = lambda s: datetime.datetime.fromisoformat(s.replace("Z", "")[:26]).timestamp()
start = t([e for e in ev if e["event"] == "launcher_started"][0]["ts"])
first = [t(e["ts"]) for e in ev if e["event"] == "rank_first_step"]
print("%.2f" % (max(first) - start) if first else "none")
PY
)
  echo "$1 prewarm=$2 rc=$rc first_step_s=$fs"
  rm -rf "$d"
}
last=${*: -1}
for _ in $(seq "$reps"); do
  for b in "$@"; do run "$b" auto; done
  run "$last" off
done
