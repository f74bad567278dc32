#!/bin/bash
# Runs a command inside bench/trixie.sh's Debian trixie chroot (torch 2.6,
# Python 3.13), in the repository (mounted at /work/repo), as root:
#
#   CGO_ENABLED=0 go build -o /work/trixie/tmp/ftl/ ./cmd/ft-launcher
#   bash bench/trixie_run.sh python3 bench/prewarm_rss.py --ft-launcher /tmp/ftl/ft-launcher
#   UNPATCH=1 bash bench/trixie_run.sh python3 -c 'import torch.distributed'
#
# Unlike bench/trixie.sh it makes nothing (run that once first) and mounts
# in a private mount namespace of its own (unshare -m): several runs, and
# bench/trixie.sh, can use the chroot at once, and nothing stays mounted
# when the command ends or is killed. UNPATCH=1 hides bench/trixie.sh's
# use_libuv=False wrapper from the command (a copy of
# torch/distributed/__init__.py without it is mounted over the file in this
# namespace only): the command sees Debian's torch as shipped, whose
# TCPStore asks for libuv and fails (docs/agentstore.md, "torch without
# libuv"). Set PYTHONDONTWRITEBYTECODE=1 for such a run, so that no
# bytecode of the hidden file is written for the others.
set -eu
export ROOT=${TRIXIE_ROOT:-/work/trixie}
export REPO=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "bench/trixie_run.sh: needs root (chroot, mount)" >&2; exit 2; }
[ -x "$ROOT/usr/bin/python3" ] || { echo "bench/trixie_run.sh: no chroot at $ROOT: run bench/trixie.sh first" >&2; exit 2; }
[ $# -gt 0 ] || { echo "usage: [UNPATCH=1] bench/trixie_run.sh COMMAND [ARG...]" >&2; exit 2; }
cp /etc/hosts "$ROOT/etc/hosts"
export UNPATCHED=
if [ "${UNPATCH:-}" = 1 ]; then
	UNPATCHED=$(mktemp "$ROOT/tmp/dist_init_unpatched.XXXXXX.py")
	trap 'rm -f "$UNPATCHED"' EXIT
	/usr/bin/python3 - "$ROOT/usr/lib/python3/dist-packages/torch/distributed/__init__.py" "$UNPATCHED" <<'EOF'
import sys
s = open(sys.argv[1]).read()
mark = "\n    # ft-launcher bench (bench/trixie.sh)"
if mark in s:
    start = s.index(mark)
    tail = "            super().__init__(*args, **kwargs)\n"
    s = s[:start] + s[s.index(tail, start) + len(tail):]
open(sys.argv[2], "w").write(s)
EOF
	chmod 644 "$UNPATCHED"
fi
unshare -m --propagation private bash -c '
set -e
mkdir -p "$ROOT/work/repo"
mount --bind "$REPO" "$ROOT/work/repo"
mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
mountpoint -q "$ROOT/dev" || mount --bind /dev "$ROOT/dev"
if [ -n "$UNPATCHED" ]; then
	mount --bind "$UNPATCHED" "$ROOT/usr/lib/python3/dist-packages/torch/distributed/__init__.py"
fi
exec chroot "$ROOT" bash -c "cd /work/repo && exec \"\$@\"" trixie_run "$@"
' inner "$@"
