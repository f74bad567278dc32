#!/usr/bin/env bash
# The Debian packages the tests need, and their install: the one place that
# knows them (scripts/test.sh and scripts/demo.sh call it; the Go package
# internal/testenv names the same packages per requirement, and its test
# checks that this list covers them all).
#
#   scripts/deps.sh [PACKAGE...]   install what is missing (apt-get update
#                                  first, noninteractive); nothing when all
#                                  is there. With names: only those.
#   scripts/deps.sh --list         every package the tests need, one a line
#   scripts/deps.sh --dry-run      what would be installed, one a line
#                                  (--missing is the same)
#
# Root runs apt-get itself; another user through sudo. FTL_DEPS_SYSROOT
# prefixes the file checks (for the test that plays a machine without the
# packages; with PATH pointing at an empty folder).
set -euo pipefail

root=${FTL_DEPS_SYSROOT:-}

# present PACKAGE: exit status 0 when PACKAGE is installed, judged by what
# the tests use of it. Builtins only, so that it works with an empty PATH.
present() {
  case $1 in
    python3) [ -x "$root/usr/bin/python3" ] ;;
    # /usr/bin/python3 is Debian's interpreter: the python3 first on PATH
    # may be another one.
    python3-torch) [ -x "$root/usr/bin/python3" ] && "$root/usr/bin/python3" -c 'import torch' 2>/dev/null ;;
    # The Python client test installs client/python with pip.
    python3-pip) command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1 ;;
    # Debian's etcd-server starts a system etcd on 127.0.0.1:2379 where a
    # service manager runs; tests use their own ports. The same holds for
    # the munge and Slurm services: slurm/slurmtest starts its own daemons
    # with their own config, socket and ports.
    # The wheel test makes a fresh virtual environment: Debian ships
    # ensurepip and its pip wheel apart from the standard library.
    python3-venv) [ -x "$root/usr/bin/python3" ] && "$root/usr/bin/python3" -c 'import ensurepip, venv; ensurepip.version()' 2>/dev/null ;;
    etcd-server) command -v etcd >/dev/null 2>&1 ;;
    iproute2) command -v ip >/dev/null 2>&1 ;;
    util-linux) command -v unshare >/dev/null 2>&1 ;;
    procps) command -v pgrep >/dev/null 2>&1 && command -v pkill >/dev/null 2>&1 ;;
    # A private Slurm cluster for slurm/slurmtest.
    munge) command -v munged >/dev/null 2>&1 ;;
    slurmctld) command -v slurmctld >/dev/null 2>&1 ;;
    slurmd) command -v slurmd >/dev/null 2>&1 ;;
    slurm-client) command -v sbatch >/dev/null 2>&1 && command -v srun >/dev/null 2>&1 ;;
    # `go test -race` builds with cgo.
    gcc) command -v gcc >/dev/null 2>&1 ;;
    libc6-dev) [ -e "$root/usr/include/stdlib.h" ] ;;
    # ft-resumer report's tests render the HTML in headless Chromium
    # (never used at run time).
    chromium) command -v chromium >/dev/null 2>&1 ;;
    # The real-container lane (k8s/kubelettest): a kubelet runs pods
    # through Debian's containerd 1.6 and runc, with Debian's CNI plugins.
    # The harness starts its own containerd (own socket, root and state
    # dirs); a system one, where a service manager starts it, is not used.
    containerd) command -v containerd >/dev/null 2>&1 && command -v ctr >/dev/null 2>&1 ;;
    runc) command -v runc >/dev/null 2>&1 ;;
    containernetworking-plugins) [ -x "$root/usr/lib/cni/bridge" ] && [ -x "$root/usr/lib/cni/host-local" ] && [ -x "$root/usr/lib/cni/loopback" ] ;;
    # scripts/image.sh builds the image of deploy/image/Containerfile with
    # buildah (no daemon); the real-container lane runs it.
    buildah) command -v buildah >/dev/null 2>&1 ;;
    *) return 1 ;;
  esac
}

all=(python3 python3-torch python3-pip python3-venv etcd-server iproute2 util-linux procps
  munge slurmctld slurmd slurm-client gcc libc6-dev chromium
  containerd runc containernetworking-plugins buildah)

mode=install
case ${1:-} in
  --list) mode=list; shift ;;
  --dry-run | --missing) mode=dry-run; shift ;;
  --install) shift ;;
  -h | --help) sed -n '2,16p' "$0"; exit 0 ;;
  -*) echo "deps.sh: unknown option $1 (allowed: --list, --dry-run, --missing, --install, --help)" >&2; exit 2 ;;
esac
want=("$@")
[ ${#want[@]} -gt 0 ] || want=("${all[@]}")

for p in "${want[@]}"; do
  case " ${all[*]} " in
    *" $p "*) ;;
    *) echo "deps.sh: unknown package $p; known: ${all[*]}" >&2; exit 2 ;;
  esac
done
if [ "$mode" = list ]; then
  printf '%s\n' "${want[@]}"
  exit 0
fi

need=()
for p in "${want[@]}"; do
  present "$p" || need+=("$p")
done

if [ "$mode" = dry-run ]; then
  [ ${#need[@]} -eq 0 ] || printf '%s\n' "${need[@]}"
  exit 0
fi
[ ${#need[@]} -gt 0 ] || exit 0

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "deps.sh: missing ${need[*]}, and installing them needs root: run as root, or install sudo" >&2
    exit 1
  fi
  sudo=(sudo)
fi
echo "== installing Debian packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
still=()
for p in "${need[@]}"; do present "$p" || still+=("$p"); done
if [ ${#still[@]} -gt 0 ]; then
  echo "deps.sh: still missing after apt-get install: ${still[*]}" >&2
  exit 1
fi
