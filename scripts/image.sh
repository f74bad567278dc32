#!/usr/bin/env bash
# Builds the ft-launcher image (deploy/image/Containerfile) with buildah,
# daemonless, as an OCI archive that `ctr images import`, `podman load` or
# `skopeo copy oci-archive:FILE docker://REGISTRY/...` take.
#
#   ./scripts/image.sh VERSION [ARCH...]
#       the image of release VERSION for each ARCH (default amd64 arm64),
#       from dist/VERSION (scripts/release.sh is run first when it is
#       missing): dist/VERSION/ft-launcher-VERSION-linux-ARCH.oci.tar,
#       named ft-launcher:VERSION
#   ./scripts/image.sh --bin-dir DIR --tag TAG --out FILE [--arch ARCH]
#       the image of binaries already built in DIR (the tests)
#
# buildah runs with its own storage in a temporary folder (vfs driver,
# chroot isolation: no daemon, no overlay mount, no user namespace), so
# nothing is left behind and root needs no container set-up.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
die() { echo "image: $*" >&2; exit 1; }
usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
command -v buildah >/dev/null || die "buildah is needed (Debian: apt-get install buildah; scripts/deps.sh installs it)"

build() { # build CONTEXT TAG OUT ARCH
  local ctx=$1 tag=$2 out=$3 arch=$4 store
  for b in ft-launcher ft-launcher-etcd ft-resumer ft-appwrapper-controller; do
    [ -x "$ctx/$b" ] || die "$ctx/$b: missing (build the binaries first)"
  done
  store=$(mktemp -d "${TMPDIR:-/tmp}/ftl-image.XXXXXX")
  # shellcheck disable=SC2064
  trap "buildah --root '$store/root' --runroot '$store/run' --storage-driver vfs rmi --all >/dev/null 2>&1 || true; rm -rf '$store'" RETURN
  local b=(buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs)
  "${b[@]}" bud --quiet --isolation chroot --arch "$arch" --os linux --timestamp 0 \
    -f "$root/deploy/image/Containerfile" -t "$tag" "$ctx" >/dev/null
  rm -f "$out"
  "${b[@]}" push --quiet "$tag" "oci-archive:$out:$tag"
  echo "image: $tag ($arch) -> $out ($(du -h "$out" | cut -f1))"
}

if [ "${1:-}" = --bin-dir ]; then
  bin= tag= out= arch=$(go env GOARCH 2>/dev/null || echo amd64)
  while [ $# -gt 0 ]; do
    case $1 in
      --bin-dir) bin=$2; shift 2 ;;
      --tag) tag=$2; shift 2 ;;
      --out) out=$2; shift 2 ;;
      --arch) arch=$2; shift 2 ;;
      *) usage ;;
    esac
  done
  [ -n "$bin" ] && [ -n "$tag" ] && [ -n "$out" ] || usage
  build "$bin" "$tag" "$out" "$arch"
  exit 0
fi

[ $# -ge 1 ] || usage
version=$1; shift
arches=("$@")
[ ${#arches[@]} -gt 0 ] || arches=(amd64 arm64)
for arch in "${arches[@]}"; do
  case $arch in amd64|arm64) ;; *) die "ARCH '$arch': amd64 or arm64" ;; esac
  dir=dist/$version/ftlauncher-$version-linux-$arch
  if [ ! -x "$dir/ft-launcher" ]; then
    ./scripts/release.sh "$version"
  fi
  build "$root/$dir" "ft-launcher:$version" "$root/dist/$version/ft-launcher-$version-linux-$arch.oci.tar" "$arch"
done
