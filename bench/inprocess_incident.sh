#!/bin/sh
# In-process restarts, one incident: a job of 4 gloo DDP ranks
# (examples/ddp_train_inprocess.py, torch from /usr/bin/python3) under
# --restart-mode in-process; once the step-20 checkpoint exists, local
# ranks 1 and 2 are SIGKILLed back to back (one kill of two pids). Prints,
# per run, the verdict's restarts_used, the in-process cycle's phases (ms)
# and the survivors' kill -> first step of the round (since_failure_s).
#
# usage: bench/inprocess_incident.sh RUNS [launcher args...]
#   e.g. bench/inprocess_incident.sh 3
#        bench/inprocess_incident.sh 3 --prewarm torch,torch.distributed
set -eu
runs=${1:-3}
[ $# -gt 0 ] && shift
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go build -o "$work/bin/" "$root/cmd/ft-launcher" "$root/cmd/ft-launcher-etcd"
i=0
while [ "$i" -lt "$runs" ]; do
	i=$((i + 1))
	d="$work/run$i"
	mkdir -p "$d"
	PYTHON_EXEC=/usr/bin/python3 "$work/bin/ft-launcher" --standalone --restart-mode in-process \
		--nproc-per-node 4 --max-restarts 3 --event-log "$d/events.jsonl" --verdict-file "$d/verdict.json" \
		--log-dir "$d/logs" "$@" \
		"$root/examples/ddp_train_inprocess.py" --ckpt-dir "$d/ckpt" --out "$d/w.json" --step-sleep 0.3 \
		>"$d/out.log" 2>&1 &
	launcher=$!
	while [ ! -e "$d/ckpt/ckpt_00000020.pt" ]; do sleep 0.05; done
	pids=$(/usr/bin/python3 -c '
import json, sys
for l in open(sys.argv[1]):
    e = json.loads(l)
    if e.get("event") == "cycle_started" and e.get("round") == 0:
        print(e["pids"][1], e["pids"][2])
' "$d/events.jsonl")
	kill -9 $pids
	wait "$launcher" || { echo "run $i: launcher exited $?"; tail -20 "$d/out.log"; exit 1; }
	/usr/bin/python3 -c '
import json, sys
v = json.load(open(sys.argv[1]))
c = v["cycles"][-1]
steps = [json.loads(l) for l in open(sys.argv[2])]
since = [e["since_failure_s"] for e in steps if e.get("event") == "inprocess_first_step"]
fb = [e for e in steps if e.get("event") == "inprocess_fallback"]
print("run %s: restarts_used=%d mode=%s fallbacks=%s survivors_first_step=%s phases_ms=%s" % (
    sys.argv[3], v["restarts_used"], c.get("mode"), [e["why"] for e in fb] or 0,
    ",".join("%.3f" % s for s in since), json.dumps(c.get("inprocess_ms"), sort_keys=True)))
' "$d/verdict.json" "$d/events.jsonl" "$i"
done
