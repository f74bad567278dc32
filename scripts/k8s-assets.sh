#!/usr/bin/env bash
# k8s-assets.sh builds the etcd and kube-apiserver binaries that the
# Kubernetes tests run under controller-runtime's envtest, from the Go module
# proxy only (no GitHub or GCS downloads), and caches them between runs.
#
# It prints the folder to use as KUBEBUILDER_ASSETS on its last line. A cold
# build takes about 9 minutes on 2 cores and ~4.5 GB of disk under the cache;
# a warm one returns at once.
#
#   FTL_K8S_CACHE   cache root (default ~/.cache/ft-launcher/k8s)
#   K8S_VERSION     k8s.io/kubernetes version (default 1.37.1; pin exact
#                   versions: the proxy's version list is incomplete here)
#   ETCD_VERSION    go.etcd.io/etcd/server/v3 version (default 3.7.3)
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.1}
ETCD_VERSION=${ETCD_VERSION:-3.7.3}
CACHE=${FTL_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ft-launcher/k8s}
OUT=$CACHE/bin-k8s${K8S_VERSION}-etcd${ETCD_VERSION}

# (Outputs are captured first: with pipefail, `cmd | grep -q` fails when
# grep exits early and cmd gets SIGPIPE.)
if [ -x "$OUT/kube-apiserver" ] && [ -x "$OUT/etcd" ] && [ -x "$OUT/kube-controller-manager" ]; then
  have_k8s=$("$OUT/kube-apiserver" --version 2>/dev/null || true)
  have_kcm=$("$OUT/kube-controller-manager" --version 2>/dev/null || true)
  have_etcd=$("$OUT/etcd" --version 2>/dev/null || true)
  if [ "$have_k8s" = "Kubernetes v${K8S_VERSION}" ] && [ "$have_kcm" = "Kubernetes v${K8S_VERSION}" ] &&
     [[ "$have_etcd" == *"etcd Version: ${ETCD_VERSION}"* ]]; then
    echo "$OUT"
    exit 0
  fi
fi

export GOMODCACHE=$CACHE/gomodcache GOCACHE=$CACHE/gocache GOPATH=$CACHE/gopath
export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local CGO_ENABLED=0
MINOR=$(echo "$K8S_VERSION" | cut -d. -f2)
STAGING="v0.${K8S_VERSION#*.}"
TMPOUT=$OUT.partial
rm -rf "$TMPOUT"
mkdir -p "$TMPOUT" "$CACHE"
log() { echo ">>> $*" >&2; }

# etcd: `go install go.etcd.io/etcd/server/v3@v…` is refused (its go.mod has
# replace directives), so build its main package from a scratch module.
EDIR=$CACHE/etcd-build
rm -rf "$EDIR"; mkdir -p "$EDIR"; cd "$EDIR"
go mod init example.com/etcdbuild >/dev/null 2>&1
go get "go.etcd.io/etcd/server/v3@v${ETCD_VERSION}" >&2
go build -trimpath -ldflags "-s -w" -o "$TMPOUT/etcd" go.etcd.io/etcd/server/v3
log "etcd v${ETCD_VERSION} built"

# kube-apiserver: k8s.io/kubernetes replaces its 30-odd staging modules with
# ./staging paths, which do not apply to a dependency; the scratch module
# replaces each with its published k8s.io/<name> v0.Y.Z instead.
KDIR=$CACHE/apiserver-build
rm -rf "$KDIR"; mkdir -p "$KDIR"; cd "$KDIR"
go mod init example.com/apiserverbuild >/dev/null 2>&1
go mod edit -go=1.26
DL=$(go mod download -json "k8s.io/kubernetes@v${K8S_VERSION}" || true)
if echo "$DL" | grep -q '"Error"'; then echo "$DL" >&2; exit 1; fi
KMOD=$(echo "$DL" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
[ -f "$KMOD" ] || { echo "k8s-assets: cannot find the go.mod of k8s.io/kubernetes@v${K8S_VERSION}" >&2; exit 1; }
for m in $(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/src/.*#\1#p' "$KMOD"); do
  go mod edit -replace "${m}=${m}@${STAGING}"
done
# Name the version on every `go get`: a bare package path means @upgrade,
# which silently moves k8s.io/kubernetes to a newer patch release.
go get "k8s.io/kubernetes@v${K8S_VERSION}" >&2
go get "k8s.io/kubernetes/cmd/kube-apiserver@v${K8S_VERSION}" "k8s.io/kubernetes/cmd/kube-controller-manager@v${K8S_VERSION}" >&2
grep -Eq "k8s.io/kubernetes v${K8S_VERSION}( |$)" go.mod || { echo "k8s-assets: go.mod does not pin k8s.io/kubernetes v${K8S_VERSION}:" >&2; grep k8s.io/kubernetes go.mod >&2; exit 1; }
LDFLAGS="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LDFLAGS="$LDFLAGS -X $p.gitVersion=v${K8S_VERSION} -X $p.gitMajor=1 -X $p.gitMinor=${MINOR} -X $p.gitTreeState=clean"
done
go build -trimpath -ldflags "$LDFLAGS" -o "$TMPOUT/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
log "kube-apiserver v${K8S_VERSION} built"
# kube-controller-manager runs the Job controller (Job -> pods) and the
# garbage collector (background deletion of a Job's pods) in the tests.
go build -trimpath -ldflags "$LDFLAGS" -o "$TMPOUT/kube-controller-manager" k8s.io/kubernetes/cmd/kube-controller-manager
log "kube-controller-manager v${K8S_VERSION} built"

rm -rf "$OUT"
mv "$TMPOUT" "$OUT"
echo "$OUT"
