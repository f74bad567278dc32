#!/bin/sh
# RSS worker. usage: sleep_worker.sh LOG
# Appends "<pid> <rank>" and becomes `sleep` under the same pid.
echo "$$ $RANK" >>"$1"
exec sleep 300
