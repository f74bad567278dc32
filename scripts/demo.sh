#!/usr/bin/env bash
# Builds ft-launcher and runs a real example job on this node: a small DDP
# training (PyTorch, gloo, CPU) with 3 ranks; rank 1 crashes once at step 25,
# ft-launcher restarts every rank, training resumes from its last checkpoint
# and finishes. Installs Debian's python3-torch first if it is missing.
# It ends with a summary of the run (what failed, the restart and how long it
# took, the wall time) taken from `ft-resumer report`, which also writes the
# run's HTML report into the work directory.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0

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

# The run's report: the HTML page, and its numbers as JSON for the summary.
verdicts=()
for v in "$work"/logs/*/verdict.json; do if [ -f "$v" ]; then verdicts+=(--verdict "$v"); fi; done
if ! bin/ft-resumer report --event-log "$work/events.jsonl" "${verdicts[@]}" \
    -o "$work/report.html" --json >"$work/report.json" 2>"$work/report.err"; then
  echo "ft-resumer report failed: $(cat "$work/report.err")" >&2
fi
rm -f "$work/report.err"

echo
echo "== summary"
/usr/bin/python3 - "$work" "$code" "$SECONDS" <<'PY' || echo "(no summary: see $work/events.jsonl)"
import datetime, json, pathlib, re, sys

work, code, script_s = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

def load(name):
    try:
        return json.loads((work / name).read_text())
    except (OSError, ValueError):
        return None

def at(ts):
    # RFC 3339 with up to nanoseconds; Python's parser takes microseconds.
    ts = re.sub(r"(\.\d{6})\d+", r"\1", ts).replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(ts)

def dur(s):
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.1f} s"

rep, out = load("report.json"), load("weights.json")
verdicts = [json.loads(p.read_text()) for p in work.glob("logs/*/verdict.json")]
rows = []
if rep:
    rounds = rep.get("rounds") or []
    for i, r in enumerate(rounds):
        if r.get("end") == "success":
            continue
        lost = r.get("steps_lost")
        rows.append(("failed", f"round {r['round']}: {r.get('reason') or r.get('end')}"
                     + (f" ({lost} steps since the last checkpoint, done again)" if lost is not None else "")))
        nxt = rounds[i + 1] if i + 1 < len(rounds) else None
        if nxt and nxt.get("ready"):
            p0, p1 = r.get("phases_s", {}), nxt.get("phases_s", {})
            launcher = p0.get("detection", 0) + p0.get("stop", 0) + p1.get("rendezvous", 0)
            rows.append(("restarted", f"all {nxt.get('world_size', '?')} ranks in round {nxt['round']}: "
                         f"{dur((at(nxt['ready']) - at(r['fault'])).total_seconds())} from the failure to every rank training again"))
            rows.append(("", f"(launcher {dur(launcher)}: stop and rendezvous; ranks' start-up "
                         f"{dur(p1.get('startup', 0))}: Python, import torch, process group, checkpoint)"))
for v in verdicts:
    n = v.get("restarts_used", 0)
    rows.append(("verdict", f"{v.get('kind')} ({v.get('reason')}); {n} restart{'' if n == 1 else 's'} used"))
if out:
    rows.append(("training", f"{out.get('steps')} steps, resumed from step {out.get('resumed_from_step')}, "
                 f"final loss {out.get('final_loss', float('nan')):.4f}"))
if rep:
    rows.append(("wall time", f"{dur(rep['wall_s'])} for the job (goodput {100 * rep['goodput']:.1f}%), "
                 f"{script_s} s for this script with the build"))
rows.append(("exit code", str(code)))
html = work / "report.html"
rows.append(("report", str(html) if html.exists() else "none (ft-resumer report failed)"))
rows.append(("records", f"{work}/events.jsonl (event log), {work}/logs (rank logs, verdict)"))
for k, v in rows:
    print(f"  {k + ':' if k else '':<11}{v}")
PY
exit $code
