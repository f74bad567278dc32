#!/usr/bin/env bash
# The whole test suite: vet, gofmt, unit and integration tests (race detector
# on the concurrent packages), and a short fuzz run of the nvrx pickle decoder.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt needed:"; echo "$unformatted"; exit 1; fi
echo "== go vet"
go vet ./...
echo "== Kubernetes test binaries (etcd, kube-apiserver, kube-controller-manager)"
# Built from the Go module proxy and cached under ~/.cache/ft-launcher/k8s:
# about 9 minutes the first time, instant after. The k8s packages' tests fail
# without them unless FTL_K8S_TESTS=skip is set.
if [ -z "${KUBEBUILDER_ASSETS:-}" ] && [ "${FTL_K8S_TESTS:-}" != skip ]; then
  KUBEBUILDER_ASSETS=$(./scripts/k8s-assets.sh)
  export KUBEBUILDER_ASSETS
fi
echo "== go test"
# One package at a time: several tests are timing-sensitive (gossip, hang
# deadlines) and the machine has 2 cores.
go test -race -count=1 -p 1 -timeout 40m ./...
echo "== integration tests that run Python ranks, again with --prewarm on (issue 11)"
FTL_TEST_PREWARM=torch,torch.distributed go test -count=1 -timeout 20m \
  -run 'Torch|Nvrx|Python|Hang|Prewarm|Computed|PID1|Tee|ErrorFile' ./integration/
if [ -d monitor/nvrxwire ]; then
  echo "== fuzz (nvrx pickle decoder, 20s)"
  go test -run '^$' -fuzz=FuzzDecodeMessage -fuzztime=20s ./monitor/nvrxwire
fi
echo "== fuzz (YAML loader with its size and alias limits, 10s; command-line parser, 10s)"
go test -run '^$' -fuzz='^FuzzYAML$' -fuzztime=10s ./configs
go test -run '^$' -fuzz='^FuzzParse$' -fuzztime=10s ./configs
