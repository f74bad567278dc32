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
#   FTL_K8S_KUBELET=1  also build kube-scheduler and kube-proxy (K8S_VERSION),
#                   the kubelet (KUBELET_VERSION) and CoreDNS
#                   (COREDNS_VERSION, with only the plugins the lane uses)
#                   into the same folder, for the real-container lane
#                   (k8s/kubelettest): about 7 more minutes cold
#   --dir           print the folder only, building nothing
#   --check         exit 0 when everything asked for is built, 1 if not
#   KUBELET_VERSION kubelet version (default 1.35.8: 1.35 is the last minor
#                   that runs on cgroup v1 and containerd 1.x, as Debian 12
#                   has; v1.35.7 and v1.35.9+ are refused by the proxy here)
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.1}
ETCD_VERSION=${ETCD_VERSION:-3.7.3}
KUBELET_VERSION=${KUBELET_VERSION:-1.35.8}
COREDNS_VERSION=${COREDNS_VERSION:-1.15.0}
WANT_KUBELET=${FTL_K8S_KUBELET:-0}
CACHE=${FTL_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ft-launcher/k8s}
OUT=$CACHE/bin-k8s${K8S_VERSION}-etcd${ETCD_VERSION}

# (Outputs are captured first: with pipefail, `cmd | grep -q` fails when
# grep exits early and cmd gets SIGPIPE.)
version_is() { # BINARY VERSION: BINARY --version prints "Kubernetes vVERSION"
  [ -x "$1" ] && [ "$("$1" --version 2>/dev/null || true)" = "Kubernetes v$2" ]
}
base_ok() {
  version_is "$OUT/kube-apiserver" "$K8S_VERSION" && version_is "$OUT/kube-controller-manager" "$K8S_VERSION" &&
    [ -x "$OUT/etcd" ] && [[ "$("$OUT/etcd" --version 2>/dev/null || true)" == *"etcd Version: ${ETCD_VERSION}"* ]]
}
extras_ok() {
  [ "$WANT_KUBELET" != 1 ] ||
    { version_is "$OUT/kube-scheduler" "$K8S_VERSION" && version_is "$OUT/kube-proxy" "$K8S_VERSION" &&
      version_is "$OUT/kubelet" "$KUBELET_VERSION" && coredns_ok; }
}
coredns_ok() { # coredns -version prints "CoreDNS-VERSION" first
  [ -x "$OUT/coredns" ] && [[ "$("$OUT/coredns" -version 2>/dev/null || true)" == "CoreDNS-${COREDNS_VERSION}"* ]]
}
case ${1:-} in
  --dir) echo "$OUT"; exit 0 ;;
  --check) base_ok && extras_ok; exit ;;
  "") ;;
  *) echo "k8s-assets: unknown argument $1 (--dir or --check, or none to build)" >&2; exit 2 ;;
esac
if base_ok && extras_ok; then
  echo "$OUT"
  exit 0
fi

export GOMODCACHE=$CACHE/gomodcache GOCACHE=$CACHE/gocache GOPATH=$CACHE/gopath
export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local CGO_ENABLED=0
TMPOUT=$OUT.partial
log() { echo ">>> $*" >&2; }

# k8s_module DIR VERSION CMD...: a scratch module in DIR that builds
# k8s.io/kubernetes@vVERSION's commands CMD..., and LDFLAGS that stamp the
# version. k8s.io/kubernetes replaces its 30-odd staging modules with
# ./staging paths, which do not apply to a dependency; the scratch module
# replaces each with its published k8s.io/<name> v0.Y.Z instead.
k8s_module() {
  local dir=$1 v=$2; shift 2
  rm -rf "$dir"; mkdir -p "$dir"; cd "$dir"
  go mod init example.com/k8sbuild >/dev/null 2>&1
  go mod edit -go=1.26
  local dl kmod m
  dl=$(go mod download -json "k8s.io/kubernetes@v${v}" || true)
  if echo "$dl" | grep -q '"Error"'; then echo "$dl" >&2; exit 1; fi
  kmod=$(echo "$dl" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  [ -f "$kmod" ] || { echo "k8s-assets: cannot find the go.mod of k8s.io/kubernetes@v${v}" >&2; exit 1; }
  for m in $(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/src/.*#\1#p' "$kmod"); do
    go mod edit -replace "${m}=${m}@v0.${v#*.}"
  done
  # Name the version on every `go get`: a bare package path means @upgrade,
  # which silently moves k8s.io/kubernetes to a newer patch release.
  go get "k8s.io/kubernetes@v${v}" >&2
  local pkgs=()
  for m in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$m@v${v}"); done
  go get "${pkgs[@]}" >&2
  grep -Eq "k8s.io/kubernetes v${v}( |$)" go.mod || { echo "k8s-assets: go.mod does not pin k8s.io/kubernetes v${v}:" >&2; grep k8s.io/kubernetes go.mod >&2; exit 1; }
  LDFLAGS="-s -w"
  for m in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    LDFLAGS="$LDFLAGS -X $m.gitVersion=v${v} -X $m.gitMajor=1 -X $m.gitMinor=$(echo "$v" | cut -d. -f2) -X $m.gitTreeState=clean"
  done
}

if ! base_ok; then
  rm -rf "$TMPOUT"
  mkdir -p "$TMPOUT" "$CACHE"
  # etcd: `go install go.etcd.io/etcd/server/v3@v…` is refused (its go.mod
  # has replace directives), so build its main package from a scratch module.
  EDIR=$CACHE/etcd-build
  rm -rf "$EDIR"; mkdir -p "$EDIR"; cd "$EDIR"
  go mod init example.com/etcdbuild >/dev/null 2>&1
  go get "go.etcd.io/etcd/server/v3@v${ETCD_VERSION}" >&2
  go build -trimpath -ldflags "-s -w" -o "$TMPOUT/etcd" go.etcd.io/etcd/server/v3
  log "etcd v${ETCD_VERSION} built"

  k8s_module "$CACHE/apiserver-build" "$K8S_VERSION" kube-apiserver kube-controller-manager
  go build -trimpath -ldflags "$LDFLAGS" -o "$TMPOUT/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
  log "kube-apiserver v${K8S_VERSION} built"
  # kube-controller-manager runs the Job controller (Job -> pods) and the
  # garbage collector (background deletion of a Job's pods) in the tests.
  go build -trimpath -ldflags "$LDFLAGS" -o "$TMPOUT/kube-controller-manager" k8s.io/kubernetes/cmd/kube-controller-manager
  log "kube-controller-manager v${K8S_VERSION} built"
  rm -rf "$OUT"
  mv "$TMPOUT" "$OUT"
fi

if ! extras_ok; then
  # The real-container lane: a real scheduler places pods, a real kubelet
  # runs them (k8s/kubelettest). Each builds into a .partial name first so
  # that an interrupted build never passes the version check.
  if ! version_is "$OUT/kube-scheduler" "$K8S_VERSION"; then
    k8s_module "$CACHE/scheduler-build" "$K8S_VERSION" kube-scheduler
    go build -trimpath -ldflags "$LDFLAGS" -o "$OUT/kube-scheduler.partial" k8s.io/kubernetes/cmd/kube-scheduler
    mv "$OUT/kube-scheduler.partial" "$OUT/kube-scheduler"
    log "kube-scheduler v${K8S_VERSION} built"
  fi
  # kube-proxy gives the lane's pods Services (TestShippedInstall); it
  # shares the scheduler's module and most of its packages.
  if ! version_is "$OUT/kube-proxy" "$K8S_VERSION"; then
    k8s_module "$CACHE/scheduler-build" "$K8S_VERSION" kube-scheduler kube-proxy
    go build -trimpath -ldflags "$LDFLAGS" -o "$OUT/kube-proxy.partial" k8s.io/kubernetes/cmd/kube-proxy
    mv "$OUT/kube-proxy.partial" "$OUT/kube-proxy"
    log "kube-proxy v${K8S_VERSION} built"
  fi
  if ! version_is "$OUT/kubelet" "$KUBELET_VERSION"; then
    k8s_module "$CACHE/kubelet-build" "$KUBELET_VERSION" kubelet
    go build -trimpath -ldflags "$LDFLAGS" -o "$OUT/kubelet.partial" k8s.io/kubernetes/cmd/kubelet
    mv "$OUT/kubelet.partial" "$OUT/kubelet"
    log "kubelet v${KUBELET_VERSION} built"
  fi
  # CoreDNS, the pods' cluster DNS in the lane: a main of our own with the
  # plugins the lane's Corefile uses (CoreDNS's documented way to choose
  # plugins at build time), so that the build fetches none of the others'
  # cloud SDKs.
  if ! coredns_ok; then
    DDIR=$CACHE/coredns-build
    rm -rf "$DDIR"; mkdir -p "$DDIR"; cd "$DDIR"
    go mod init example.com/corednsbuild >/dev/null 2>&1
    go mod edit -go=1.26
    cat >main.go <<'GOEOF'
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
)

// The directives in CoreDNS's own order (plugin.cfg).
func init() { dnsserver.Directives = []string{"bind", "errors", "kubernetes"} }

func main() { coremain.Run() }
GOEOF
    go get "github.com/coredns/coredns@v${COREDNS_VERSION}" >&2
    go build -trimpath -ldflags "-s -w" -o "$OUT/coredns.partial" .
    mv "$OUT/coredns.partial" "$OUT/coredns"
    log "CoreDNS v${COREDNS_VERSION} built"
  fi
fi
echo "$OUT"
