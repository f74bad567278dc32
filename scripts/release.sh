#!/usr/bin/env bash
# Builds a release of ft-launcher: static binaries of every command (cmd/*)
# for linux/amd64 and linux/arm64, one tarball and one pip wheel (the
# binaries and the ft_launcher_client package; docs/install.md) per
# architecture, and SHA256SUMS, all under dist/VERSION/.
#
# Usage: ./scripts/release.sh VERSION [REF]      e.g. ./scripts/release.sh 0.2.0
# VERSION is a canonical PEP 440 version (0.2.0, 0.2.0rc1, 0.2.1.dev3): the
# wheels' version, which pip compares, is the binaries' --version.
#
# It builds REF (default HEAD) as committed, from `git archive`, so that
# uncommitted edits never reach a release; the commit is stamped with -X
# because an archive carries no VCS information. The binaries are static
# (CGO_ENABLED=0, no ELF interpreter), so they run in any Linux image: old
# glibc, musl (Alpine), distroless.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

die() { echo "release: $*" >&2; exit 1; }
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: $0 VERSION [REF]   (e.g. $0 0.2.0)" >&2; exit 2; }
version=$1
ref=${2:-HEAD}
[[ $version =~ ^[0-9A-Za-z][0-9A-Za-z.+_-]*$ ]] || { echo "release: VERSION '$version': use letters, digits and . + _ - only" >&2; exit 2; }
for tool in git go file readelf sha256sum tar gzip; do
  command -v "$tool" >/dev/null || die "$tool is needed"
done
commit=$(git rev-parse --verify --quiet --short=7 "$ref^{commit}") || die "$ref is not a commit"
if [ "$ref" = HEAD ] && [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "release: note: uncommitted changes in the work tree are not part of the release (it is built from $commit)" >&2
fi

module=$(go list -m)
vpkg=$module/internal/version
ldflags="-s -w -X $vpkg.Version=$version -X $vpkg.Commit=$commit"
epoch=$(git log -1 --format=%ct "$commit") # tarball timestamps: the commit's, so rebuilds are identical
src=$(mktemp -d)
tools=$(mktemp -d)
trap 'rm -rf "$src" "$tools"' EXIT
# The wheel tool is this script's own (the work tree's), like the script:
# an older REF is packaged the same way. The version check comes before
# anything is built or a previous dist/VERSION removed.
go build -o "$tools/mkwheel" ./internal/wheel/cmd/mkwheel
"$tools/mkwheel" -check-version "$version" || exit 2
out=dist/$version
rm -rf "$out"
mkdir -p "$out"
git archive "$commit" | tar -x -C "$src"
cmds=$(cd "$src" && for d in cmd/*/; do [ -f "$d/main.go" ] && basename "$d"; done)
[ -n "$cmds" ] || die "no commands under cmd/ in $commit"

# verify checks one binary: right architecture, static (no interpreter, no
# dynamic section), built as this script asked.
verify() {
  local bin=$1 arch=$2 want desc meta
  case $arch in
    amd64) want="x86-64" ;;
    arm64) want="ARM aarch64" ;;
  esac
  desc=$(file -b "$bin")
  [[ $desc == *"$want"* ]] || die "$bin: not a linux/$arch binary: $desc"
  [[ $desc == *"statically linked"* && $desc != *interpreter* ]] || die "$bin: not statically linked: $desc"
  if readelf -lW "$bin" | grep -q 'INTERP\|DYNAMIC'; then die "$bin: has an ELF interpreter or dynamic section"; fi
  meta=$(go version -m "$bin")
  # (-trimpath keeps -ldflags out of the build info; the version is checked
  # by running the binaries below.)
  for setting in "CGO_ENABLED=0" "GOARCH=$arch" "GOOS=linux" "-trimpath=true"; do
    grep -qF -- "$setting" <<<"$meta" || die "$bin: go version -m lacks $setting"
  done
}

for arch in amd64 arm64; do
  name=ftlauncher-$version-linux-$arch
  dir=$out/$name
  mkdir -p "$dir"
  echo "== build linux/$arch: $(echo $cmds)"
  (cd "$src" && CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$root/$dir/" ./cmd/...)
  for c in $cmds; do
    [ -x "$dir/$c" ] || die "$dir/$c was not built"
    verify "$dir/$c" "$arch"
  done
  cp "$src/README.md" "$dir/"
  [ -f "$src/LICENSE" ] && cp "$src/LICENSE" "$dir/"
  tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner -C "$out" -cf - "$name" | gzip -9n >"$out/$name.tar.gz"
  # The wheel wraps these very binaries (mkwheel checks again that they are
  # static: its tags promise musl and old glibc systems alike).
  echo "== wheel linux/$arch"
  "$tools/mkwheel" -version "$version" -arch "$arch" -bin "$dir" -module "$src/client/python/ft_launcher_client" \
    -readme "$src/README.md" -epoch "$epoch" -out "$out" >/dev/null
done
if /usr/bin/python3 -m pip --version >/dev/null 2>&1 || python3 -m pip --version >/dev/null 2>&1; then
  "$root/scripts/wheel.sh" --check "$out"/*.whl
else
  echo "release: note: no pip here: the wheels' tags were not checked with pip (scripts/wheel.sh --check)" >&2
fi

# The binaries this machine can run must say the right version.
if [ "$(go env GOHOSTARCH)" = amd64 ]; then
  for c in $cmds; do
    line=$("$out/ftlauncher-$version-linux-amd64/$c" --version)
    [[ $line == "$c $version (commit $commit, go"*", linux/amd64)" ]] || die "$c --version printed '$line'"
  done
fi

(cd "$out" && sha256sum -- *.tar.gz *.whl */* >SHA256SUMS)
echo "== dist/$version (commit $commit)"
(cd "$out" && ls -l -- *.tar.gz *.whl SHA256SUMS)
