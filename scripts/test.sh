#!/usr/bin/env bash
# The whole test suite: installs the Debian packages the tests need when
# they are missing (scripts/deps.sh), then gofmt, vet, unit and integration
# tests (race detector on), the integration tests again with --prewarm, and
# short fuzz runs. The go test runs stream through internal/testsummary,
# fuzz runs included (each fuzz target counts as one test), and the output
# ends with their count: the failures, the skipped tests with
# their reasons, the number of environment skips, and the last line
# "N passed, N failed, N skipped".
#
# Under CI (CI set) or with FTL_REQUIRE_ALL=1, a test whose environment is
# missing (Slurm, cgroups, namespaces, the control plane, torch ...) fails
# instead of skipping (internal/testenv); only a GPU may skip.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== Debian packages the tests need (scripts/deps.sh)"
./scripts/deps.sh

work=$(mktemp -d "${TMPDIR:-/tmp}/ftl-test.XXXXXX")
k8sbuild=
trap '[ -z "$k8sbuild" ] || kill -- -"$k8sbuild" 2>/dev/null || true; rm -rf "$work"' EXIT

echo "== Kubernetes test binaries (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, kubelet, CoreDNS)"
# Built from the Go module proxy and cached under ~/.cache/ft-launcher/k8s:
# about 16 minutes the first time, instant after. A first build runs in the
# background at nice 19 while the tests that need none of them run; the
# Kubernetes packages wait for it when they start (k8stest.Assets:
# FTL_K8S_ASSETS_DONE holds its exit status once it ends, its log is
# FTL_K8S_ASSETS_LOG). Without the binaries the k8s packages' tests fail,
# unless FTL_K8S_TESTS=skip is set (then they skip, except under CI, where
# they fail naming what is missing). The kubelet, kube-scheduler,
# kube-proxy and CoreDNS (FTL_K8S_KUBELET=1) are for k8s/kubelettest's real
# containers.
if [ -z "${KUBEBUILDER_ASSETS:-}" ] && [ "${FTL_K8S_TESTS:-}" != skip ]; then
  KUBEBUILDER_ASSETS=$(FTL_K8S_KUBELET=1 ./scripts/k8s-assets.sh --dir)
  export KUBEBUILDER_ASSETS
  if FTL_K8S_KUBELET=1 ./scripts/k8s-assets.sh --check; then
    echo "cached in $KUBEBUILDER_ASSETS"
  else
    export FTL_K8S_ASSETS_DONE=$work/k8s-assets.done FTL_K8S_ASSETS_LOG=$work/k8s-assets.log
    set -m # its own process group, for the trap above
    (FTL_K8S_KUBELET=1 nice -n 19 ./scripts/k8s-assets.sh >"$FTL_K8S_ASSETS_LOG" 2>&1; echo $? >"$FTL_K8S_ASSETS_DONE.partial"
      mv "$FTL_K8S_ASSETS_DONE.partial" "$FTL_K8S_ASSETS_DONE") &
    k8sbuild=$!
    set +m
    echo "building in the background (log: $FTL_K8S_ASSETS_LOG)"
  fi
fi

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt needed:"; echo "$unformatted"; exit 1; fi
echo "== go vet"
go vet ./...
go build -o "$work/testsummary" ./internal/testsummary/cmd/testsummary
summary() { "$work/testsummary" --state "$work/runs.jsonl" -- "$@"; }
status=0

echo "== go test"
# One package at a time: several tests are timing-sensitive (gossip, hang
# deadlines) and the machine has 2 cores.
summary go test -json -race -count=1 -p 1 -timeout 60m ./... || status=1
echo "== integration tests that run Python ranks, again with --prewarm on"
# The tests that name --prewarm themselves ran as they are in the pass above.
# Left out, because a standby would change nothing: the pip install test and
# TestComputedTimeoutsIgnoreLauncherStall (--max-restarts 0) restart no rank,
# so no rank is ever handed to a standby. The launcher PID 1, --tee and
# error-file tests are not selected: their ranks are --no-python, which
# gets no --prewarm (the harness's prewarmArgs), so they would run exactly
# as in the pass above.
FTL_TEST_PREWARM=torch,torch.distributed summary go test -json -count=1 -timeout 20m \
  -run 'Torch|Nvrx|Python|Hang|Computed' \
  -skip '^TestPrewarm|^TestInProcessPrewarmReplacement$|^TestPythonClientInstallsWithPipAndHeartbeats$|^TestComputedTimeoutsIgnoreLauncherStall$' ./integration/ || status=1
# Fuzz budgets are input counts, not durations: with a duration, Go's fuzz
# coordinator (go1.26) can fail a target with a bare "context deadline
# exceeded" when a starved worker is mid-input at the deadline
# (go.dev/issue/75804, fixed in go1.27). A count has no deadline to race.
if [ -d monitor/nvrxwire ]; then
  echo "== fuzz (nvrx pickle decoder, 300,000 inputs, about 20 s)"
  summary go test -json -run '^$' -fuzz=FuzzDecodeMessage -fuzztime=300000x ./monitor/nvrxwire || status=1
fi
echo "== fuzz (YAML loader with its size and alias limits, 25,000 inputs; command-line parser, 20,000 inputs; about 10 s each)"
summary go test -json -run '^$' -fuzz='^FuzzYAML$' -fuzztime=25000x ./configs || status=1
summary go test -json -run '^$' -fuzz='^FuzzParse$' -fuzztime=20000x ./configs || status=1

echo "== summary of the go test runs"
"$work/testsummary" --report "$work/runs.jsonl" || status=1
exit $status
