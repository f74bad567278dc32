// Package appwrapper reconciles AppWrapper objects
// (workload.codeflare.dev/v1beta2) with the fault-tolerance contract of the
// upstream AppWrapper controller, plus ft-launcher's own signals.
// docs/kubernetes.md states the contract and is cited by section title in
// the comments here. "Upstream" is project-codeflare/appwrapper v1.2.1
// (https://github.com/project-codeflare/appwrapper/tree/v1.2.1, its fault
// tolerance documented at
// https://project-codeflare.github.io/appwrapper/arch-fault-tolerance/);
// its files are cited by name: api/v1beta2/appwrapper_types.go,
// internal/controller/appwrapper/{appwrapper_controller,
// resource_management,node_health_monitor}.go, pkg/config/config.go and
// pkg/utils/utils.go.
//
// The package has two halves. The pure half, which needs no API server,
// holds the decisions: the operator configuration (config.go), the
// per-AppWrapper fault-tolerance parameters read from annotations
// (params.go), pod-set inference and validation (podsets.go), the objects
// to create with their injected labels, affinities and environment
// (inject.go, autopilot.go), and the health summary of a workload's pods,
// including the verdicts ft-launcher leaves in termination messages
// (summary.go), and the Running phase's reset decision, assess (assess.go),
// kept beside the reconcile loop as jobset keeps its failure policy. The
// reconciler half drives the phase machine against the API server with
// these functions: it gathers the facts and applies the decisions.
//
// Differences from upstream are deliberate and small: durations in the
// configuration may be written as "90s" as well as integer nanoseconds, and
// misspelt keys and values the API would reject are refused at load;
// exit-code annotation lists tolerate spaces and report bad entries; every
// malformed annotation is reported to the caller instead of only logged;
// multi-host Ray worker groups count numOfHosts pods per replica; and pods
// are kept off the nodes that ft-launcher quarantined and learn their
// workload's identity from FTL_WORKLOAD and FTL_WORKLOAD_RESETS.
//
// The reconciler adds what upstream lacks: failures are seen from pod,
// component and node watches rather than a periodic requeue (a pass every
// reevaluatePeriod is only a safety net); a pod short after the workload
// was ready is timed from PodsReady turning False plus the failure grace,
// so a replacement that comes back in time costs no reset; during a
// deletion, pods of a dead node are forced after deadNodeGracePeriod
// instead of the forceful-deletion grace; upstream's Events are emitted in
// its form beside ours; a component
// that looks missing is confirmed with an uncached read before the
// workload fails; a launcher's no_restart verdict fails the workload at
// once; the nodes the launchers quarantined are recorded on the
// AppWrapper (ft-launcher.dev/avoid-nodes) and avoided by recreated pods;
// and every transition is an Event with the attempt number.
package appwrapper
