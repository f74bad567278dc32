#!/bin/sh
# Restart-latency worker (no interpreter to import). usage: restart_worker.sh LOG DELAY
# Appends "<ns> start <rank> <cycle> <pid>" on start. In cycle 0 rank 0 sleeps DELAY,
# appends "<ns> crash" and exits 1; the other ranks become `sleep` (same pid)
# until the launcher stops them. In later cycles every rank exits 0.
log=$1
cycle=${TORCHELASTIC_RESTART_COUNT:-0}
echo "$(date +%s%N) start $RANK $cycle $$" >>"$log"
[ "$cycle" = 0 ] || exit 0
if [ "$RANK" = 0 ]; then
	sleep "$2"
	echo "$(date +%s%N) crash" >>"$log"
	exit 1
fi
exec sleep 120
