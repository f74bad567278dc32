#!/bin/sh
# Start-latency worker. usage: stamp_worker.sh LOG
# Appends "<ns> <rank>" as its first action and exits 0.
echo "$(date +%s%N) $RANK" >>"$1"
