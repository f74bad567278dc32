#!/bin/bash
# Runs bench/prewarm.py inside a Debian trixie chroot, whose python3-torch is
# 2.6 (Python 3.13), so that NVIDIA's ft_launcher (nvidia-resiliency-ext
# v0.6.0 needs torch >= 2.3; Debian bookworm's torch here is 1.13) runs side
# by side with torchrun 2.6 and ft-launcher on this CPU machine. As root;
# the chroot needs about 2.5 GB and Debian's mirror (debootstrap, apt).
#
#   bash bench/gpu/nvrx.sh NVIDIA/nvidia-resiliency-ext-checkout   # .nvrx/
#   bash bench/trixie.sh --reps 5 --nproc 2,4 \
#       --kinds torchrun,torchrun-unshared,nvrx,cold,prewarm,inprocess-prewarm \
#       --prewarm torch,torch.distributed,torch._dynamo
#
# Arguments go to bench/prewarm.py; --python, --torchrun, --nvrx and
# --ft-launcher are set here. TRIXIE_ROOT (default /work/trixie) holds the
# chroot, made on the first run and reused.
#
# Two changes to the chroot, the same for every launcher measured:
# - /etc/hosts from the host: torchrun and nvrx advertise the hostname, and
#   an unresolvable one hangs their rendezvous.
# - Debian's torch 2.6 is built without libuv, while TCPStore asks for it by
#   default (use_libuv=True), so every TCPStore that does not pass
#   use_libuv=False fails: "use_libuv was requested but PyTorch was build
#   without libuv support". That is torchrun's own rendezvous store, and
#   every rank's client when TORCHELASTIC_USE_AGENT_STORE=True (torch's
#   rendezvous.py does not pass use_libuv there, and USE_LIBUV=0 does not
#   reach it). torch.distributed.TCPStore is wrapped so that it always asks
#   for the socket backend, the only one this build has.
set -eu
ROOT=${TRIXIE_ROOT:-/work/trixie}
REPO=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "bench/trixie.sh: needs root (debootstrap, chroot, mount)" >&2; exit 2; }
[ -d "$REPO/.nvrx/nvidia_resiliency_ext" ] || {
	echo "bench/trixie.sh: $REPO/.nvrx is missing: run bench/gpu/nvrx.sh with a nvidia-resiliency-ext checkout first" >&2
	exit 2
}
if [ ! -x "$ROOT/usr/bin/python3" ] || ! chroot "$ROOT" python3 -c 'import torch, grpc, httpx' 2>/dev/null; then
	command -v debootstrap >/dev/null || apt-get install -y -q --no-install-recommends debootstrap
	# debootstrap's resolver misses some dependencies (python3-grpcio's libre2);
	# apt-get -f install in the chroot completes them.
	debootstrap --variant=minbase \
		--include=python3,python3-torch,python3-numpy,python3-psutil,python3-yaml,python3-grpcio,python3-protobuf,python3-httpx,python3-defusedxml,python3-packaging,procps \
		trixie "$ROOT" http://deb.debian.org/debian || true
	echo 'deb http://deb.debian.org/debian trixie main' >"$ROOT/etc/apt/sources.list"
	cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
	chroot "$ROOT" bash -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get -f install -y -q'
fi
cp /etc/hosts "$ROOT/etc/hosts"
init=$(echo "$ROOT"/usr/lib/python3/dist-packages/torch/distributed/__init__.py)
if ! grep -q 'ft-launcher bench' "$init"; then
	/usr/bin/python3 - "$init" <<'EOF'
import sys
p = sys.argv[1]
s = open(p).read()
anchor = "        Work as _Work,\n    )\n"
assert s.count(anchor) == 1, "torch/distributed/__init__.py: the TCPStore import is not where torch 2.6 has it"
s = s.replace(anchor, anchor + '''
    # ft-launcher bench (bench/trixie.sh): this torch is built without libuv;
    # ask every TCPStore for the socket backend, the only one it has.
    _TCPStore = TCPStore

    class TCPStore(_TCPStore):  # type: ignore[no-redef]
        def __init__(self, *args, **kwargs):
            kwargs["use_libuv"] = False
            super().__init__(*args, **kwargs)
''')
open(p, "w").write(s)
EOF
fi
rm -rf "$ROOT/opt/nvrx" && cp -r "$REPO/.nvrx" "$ROOT/opt/nvrx"
# ft-launcher-etcd too: --nodes 2 runs the embedded etcd rendezvous, which
# ft-launcher starts from the binary beside it.
(cd "$REPO" && CGO_ENABLED=0 go build -ldflags "-s -w" -o "$ROOT/opt/" ./cmd/ft-launcher ./cmd/ft-launcher-etcd)
mkdir -p "$ROOT/work/repo" "$ROOT/proc" "$ROOT/dev"
chmod 1777 "$ROOT/tmp"
cleanup() {
	umount "$ROOT/work/repo" 2>/dev/null || true
	umount "$ROOT/proc" 2>/dev/null || true
	umount "$ROOT/dev" 2>/dev/null || true
}
trap cleanup EXIT
mountpoint -q "$ROOT/work/repo" || mount --bind "$REPO" "$ROOT/work/repo"
mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
mountpoint -q "$ROOT/dev" || mount --bind /dev "$ROOT/dev"
echo "chroot $ROOT: $(chroot "$ROOT" python3 -c 'import sys, torch; print("Python", sys.version.split()[0], "torch", torch.__version__)'); nvrx $(cat "$REPO/.nvrx/VERSION")" >&2
chroot "$ROOT" bash -c 'cd /work/repo && exec python3 bench/prewarm.py --python /usr/bin/python3 \
	--torchrun "/usr/bin/python3 -m torch.distributed.run" \
	--nvrx "env PYTHONPATH=/opt/nvrx /usr/bin/python3 -m nvidia_resiliency_ext.fault_tolerance.launcher" \
	--ft-launcher /opt/ft-launcher "$@"' prewarm "$@"
