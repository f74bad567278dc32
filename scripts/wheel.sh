#!/usr/bin/env bash
# Builds ft-launcher's platform wheels (docs/install.md): per architecture,
# one file holding the static ft-launcher, ft-launcher-etcd, ft-resumer and
# ft-appwrapper-controller,
# built as scripts/release.sh builds them, and the ft_launcher_client
# package; `pip install` puts the commands on the environment's PATH.
#
#   scripts/wheel.sh [-o DIR] VERSION [ARCH...]
#       VERSION: a canonical PEP 440 version (0.2.0, 0.2.0rc1, 0.2.1.dev3);
#       ARCH: amd64, arm64 (default: this machine's); DIR: where the wheels
#       go (default dist/wheels). Prints each wheel's path on the last lines.
#   scripts/wheel.sh --check WHEEL...
#       asks pip, without installing, whether it would install each wheel on
#       every platform it is tagged for (glibc and musl) with Python 3.8,
#       and refuse it to Python 3.7. The builds above run it too.
#
# The build takes the work tree as it is, uncommitted edits included (the
# stamped commit then ends in +dirty), to try a wheel or to test one;
# scripts/release.sh builds the released wheels from a commit, around the
# very binaries of its tarballs.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
die() { echo "wheel: $*" >&2; exit 1; }

# pip_python: an interpreter with pip (Debian's first, as the tests use it).
pip_python() {
  local py
  for py in /usr/bin/python3 python3; do
    if "$py" -m pip --version >/dev/null 2>&1; then
      echo "$py"
      return 0
    fi
  done
  return 1
}

# pip_takes PY DIR PLATFORM PYVER VERSION: whether pip, deciding as on
# PLATFORM with Python PYVER, would take ft-launcher VERSION from DIR.
# `pip download`, not `pip install --dry-run`: only download weighs
# Requires-Python against --python-version (pip 23) rather than the running
# interpreter. --isolated: no pip.conf or PIP_* variable adds an index or
# other links.
pip_takes() {
  "$1" -m pip --isolated download --quiet --no-index --find-links "$2" --no-deps --only-binary=:all: \
    --platform "$3" --python-version "$4" --dest "$2/dl" "ft-launcher==$5" 2>&1
}

# check WHEEL...: pip's own matching of tags and Requires-Python. pip takes
# --platform literally (a real musl 1.2 system asks for musllinux_1_2,
# _1_1 and _1_0 itself), so each tag of the file name is asked for as it is.
check() {
  local py whl name ver plats plat tmp out
  py=$(pip_python) || die "--check needs python3 with pip (Debian: python3-pip)"
  for whl in "$@"; do
    [ -f "$whl" ] || die "$whl: no such wheel"
    name=$(basename "$whl" .whl)
    ver=$(cut -d- -f2 <<<"$name")
    plats=$(cut -d- -f5 <<<"$name")
    tmp=$(mktemp -d)
    ln -s "$(cd "$(dirname "$whl")" && pwd)/$(basename "$whl")" "$tmp/"
    for plat in ${plats//./ }; do
      if ! out=$(pip_takes "$py" "$tmp" "$plat" 3.8 "$ver"); then
        rm -rf "$tmp"
        die "pip would not install $(basename "$whl") on $plat with Python 3.8: $out"
      fi
    done
    if pip_takes "$py" "$tmp" "${plats%%.*}" 3.7 "$ver" >/dev/null; then
      rm -rf "$tmp"
      die "pip would install $(basename "$whl") on Python 3.7, below its Requires-Python"
    fi
    rm -rf "$tmp"
    echo "== pip takes $(basename "$whl") on ${plats//./, } (Python 3.8) and refuses it to Python 3.7"
  done
}

if [ "${1:-}" = --check ]; then
  shift
  [ $# -gt 0 ] || die "usage: $0 --check WHEEL..."
  check "$@"
  exit 0
fi

out=dist/wheels
if [ "${1:-}" = -o ]; then
  [ $# -ge 2 ] || die "-o needs a directory"
  out=$2
  shift 2
fi
[ $# -ge 1 ] || { echo "usage: $0 [-o DIR] VERSION [ARCH...]   (e.g. $0 0.2.0 amd64 arm64)" >&2; exit 2; }
version=$1
shift
arches=("$@")
[ ${#arches[@]} -gt 0 ] || arches=("$(go env GOHOSTARCH)")
mkdir -p "$out"
out=$(cd "$out" && pwd)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go build -o "$work/mkwheel" ./internal/wheel/cmd/mkwheel
# Before the builds: a version pip cannot take fails in a second, not after
# minutes of compiling.
"$work/mkwheel" -check-version "$version" || exit 2

commit=unknown
if c=$(git rev-parse --verify --quiet --short=7 HEAD 2>/dev/null); then
  commit=$c
  [ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || commit=$c+dirty
fi
module=$(go list -m)
vpkg=$module/internal/version
# release.sh's build: static, no paths of this machine, version and commit
# stamped (-buildvcs=false: the commit is given, as for a source tarball).
ldflags="-s -w -X $vpkg.Version=$version -X $vpkg.Commit=$commit"
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)
wheels=()
for arch in "${arches[@]}"; do
  bin=$work/$arch
  mkdir -p "$bin"
  echo "== build linux/$arch (commit $commit)" >&2
  CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$bin/" \
    ./cmd/ft-launcher ./cmd/ft-launcher-etcd ./cmd/ft-resumer ./cmd/ft-appwrapper-controller
  wheels+=("$("$work/mkwheel" -version "$version" -arch "$arch" -bin "$bin" -module client/python/ft_launcher_client \
    -readme README.md -epoch "$epoch" -out "$out")")
done
if pip_python >/dev/null; then
  check "${wheels[@]}" >&2
else
  echo "wheel: note: no pip here: tags not checked with pip" >&2
fi
printf '%s\n' "${wheels[@]}"
