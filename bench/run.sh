#!/bin/sh
# Side-by-side ft-launcher vs torchrun benchmarks; prints markdown tables.
# usage: bench/run.sh [--ft-launcher PATH] [--reps N] [--only restart,startup,rss] ...
# ft-launcher defaults to $FT_LAUNCHER, else /tmp/ft-launcher
#   (build it with: go build -o /tmp/ft-launcher ./cmd/ft-launcher);
# if absent, only torchrun is measured. torchrun is Debian's torch 1.13 via
# /work/shared/bench/torchrun-py311.py, overridable with --torchrun CMD or $TORCHRUN.
# All options are passed to bench.py (see bench/bench.py --help).
# bench/run.sh --multinode [OPTIONS] runs the multi-node benchmarks instead
# (bench/multinode.py: 4 nodes on loopback; see bench/multinode.py --help).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = --multinode ]; then
	shift
	exec /usr/bin/python3 "$here/multinode.py" "$@"
fi
exec /usr/bin/python3 "$here/bench.py" "$@"
