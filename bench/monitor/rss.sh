#!/bin/sh
# Launcher RSS and CPU with N ranks heartbeating at RATE Hz each through the
# Go client (monbench rank hb). Samples /proc/<launcher>/status VmRSS (max)
# and utime+stime from /proc/<launcher>/stat over the heartbeating window.
# usage: bench/monitor/rss.sh [NPROC] [RATE] [SECONDS]   (run from the repo root)
set -eu
NPROC=${1:-8}; RATE=${2:-1000}; SECS=${3:-10}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/ftl" ./cmd/ft-launcher
go build -o "$tmp/monbench" ./bench/monitor/monbench
"$tmp/ftl" --standalone --nproc-per-node "$NPROC" --no-python "$tmp/monbench" rank hb "$RATE" "${SECS}s" \
  >"$tmp/out" 2>&1 &
pid=$!
tck=$(getconf CLK_TCK)
cpu() { awk '{print $14+$15}' "/proc/$pid/stat"; }
sleep 2 # startup and connects; the window below is steady heartbeating
c0=$(cpu); t0=$(date +%s.%N); maxrss=0
win=$((SECS - 4))
i=0
while [ $i -lt $((win * 10)) ]; do
  r=$(awk '/^VmRSS/{print $2}' "/proc/$pid/status")
  [ "$r" -gt "$maxrss" ] && maxrss=$r
  sleep 0.1; i=$((i + 1))
done
c1=$(cpu); t1=$(date +%s.%N)
ranks=$(pgrep -c -P "$pid" || true)
wait $pid || { echo "launcher failed:"; cat "$tmp/out"; exit 1; }
echo "nproc=$NPROC rate=${RATE}Hz ranks_seen=$ranks launcher_max_VmRSS=${maxrss}kB" \
  "launcher_cpu=$(echo "$c0 $c1 $t0 $t1 $tck" | awk '{printf "%.2f%%", 100*($2-$1)/$5/($4-$3)}') of one core over $(echo "$t0 $t1" | awk '{printf "%.1f", $2-$1}')s"
