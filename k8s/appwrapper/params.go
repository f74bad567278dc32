package appwrapper

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
)

// Params are one AppWrapper's fault-tolerance parameters: the operator
// defaults overridden by annotations on the AppWrapper's metadata
// (docs/kubernetes.md, "The contract"; component annotations are not consulted).
type Params struct {
	AdmissionGracePeriod         time.Duration
	WarmupGracePeriod            time.Duration
	FailureGracePeriod           time.Duration
	RetryPausePeriod             time.Duration
	ForcefulDeletionGracePeriod  time.Duration
	DeletionOnFailureGracePeriod time.Duration
	SuccessTTL                   time.Duration
	// RetryLimit is not clamped; <= 0 makes every unhealthy verdict final.
	RetryLimit int32
	// TerminalExitCodes and RetryableExitCodes are nil when the annotation
	// is unset (or unusable); a set retryableExitCodes makes every other
	// non-zero exit code terminal.
	TerminalExitCodes  []int32
	RetryableExitCodes []int32
}

// ParamsFor reads the fault-tolerance annotations of aw over the defaults
// in ft. Annotated durations are clamped to [0, GracePeriodMaximum]; the
// retry limit is not; successTTLDuration counts only when it is positive
// and below the configured SuccessTTL (it can shorten, never lengthen).
// Each malformed annotation yields one problem naming it, its value and
// what is allowed, and its default is used, as upstream does.
func ParamsFor(aw *v1beta2.AppWrapper, ft FaultToleranceConfig) (Params, []string) {
	var problems []string
	ann := aw.GetAnnotations()
	ceiling := max(ft.GracePeriodMaximum.Duration, 0)

	duration := func(key string, def time.Duration) time.Duration {
		raw, ok := ann[key]
		if !ok {
			return def
		}
		d, err := time.ParseDuration(strings.TrimSpace(raw))
		if err != nil {
			problems = append(problems, fmt.Sprintf(
				"annotation %s=%q is not a duration (want e.g. \"90s\" or \"1h30m\", at most %v); using the default %v",
				key, raw, ceiling, def))
			return def
		}
		return min(max(d, 0), ceiling)
	}

	p := Params{
		AdmissionGracePeriod:         duration(v1beta2.AdmissionGracePeriodDurationAnnotation, ft.AdmissionGracePeriod.Duration),
		WarmupGracePeriod:            duration(v1beta2.WarmupGracePeriodDurationAnnotation, ft.WarmupGracePeriod.Duration),
		FailureGracePeriod:           duration(v1beta2.FailureGracePeriodDurationAnnotation, ft.FailureGracePeriod.Duration),
		RetryPausePeriod:             duration(v1beta2.RetryPausePeriodDurationAnnotation, ft.RetryPausePeriod.Duration),
		ForcefulDeletionGracePeriod:  duration(v1beta2.ForcefulDeletionGracePeriodAnnotation, ft.ForcefulDeletionGracePeriod.Duration),
		DeletionOnFailureGracePeriod: duration(v1beta2.DeletionOnFailureGracePeriodAnnotation, 0),
		SuccessTTL:                   ft.SuccessTTL.Duration,
		RetryLimit:                   ft.RetryLimit,
	}

	if raw, ok := ann[v1beta2.SuccessTTLAnnotation]; ok {
		d, err := time.ParseDuration(strings.TrimSpace(raw))
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf(
				"annotation %s=%q is not a duration (want e.g. \"1h\", above 0 and below %v); using the default %v",
				v1beta2.SuccessTTLAnnotation, raw, ft.SuccessTTL.Duration, ft.SuccessTTL.Duration))
		case d > 0 && d < ft.SuccessTTL.Duration:
			p.SuccessTTL = d
		}
	}

	if raw, ok := ann[v1beta2.RetryLimitAnnotation]; ok {
		n, err := strconv.ParseInt(strings.TrimSpace(raw), 10, 32)
		if err != nil {
			problems = append(problems, fmt.Sprintf(
				"annotation %s=%q is not an integer (want e.g. \"3\"; 0 or less means no retry); using the default %d",
				v1beta2.RetryLimitAnnotation, raw, ft.RetryLimit))
		} else {
			p.RetryLimit = int32(n)
		}
	}

	var more []string
	p.TerminalExitCodes, more = exitCodes(ann, v1beta2.TerminalExitCodesAnnotation)
	problems = append(problems, more...)
	p.RetryableExitCodes, more = exitCodes(ann, v1beta2.RetryableExitCodesAnnotation)
	problems = append(problems, more...)
	return p, problems
}

// exitCodes parses a comma-separated list of exit codes. Unlike upstream
// (upstream's appwrapper_controller.go, Running phase), spaces around entries
// are allowed and bad entries are reported instead of silently dropped. A list
// left with no valid code counts as unset: an empty retryableExitCodes would
// make every failure terminal, which a typo must not do.
func exitCodes(ann map[string]string, key string) ([]int32, []string) {
	raw, ok := ann[key]
	if !ok {
		return nil, nil
	}
	var codes []int32
	var bad []string
	for entry := range strings.SplitSeq(raw, ",") {
		entry = strings.TrimSpace(entry)
		n, err := strconv.ParseInt(entry, 10, 32)
		if err != nil {
			bad = append(bad, strconv.Quote(entry))
			continue
		}
		if !slices.Contains(codes, int32(n)) {
			codes = append(codes, int32(n))
		}
	}
	var problems []string
	switch {
	case len(codes) == 0:
		problems = append(problems, fmt.Sprintf(
			"annotation %s=%q has no exit code (want a comma-separated list of integers such as \"1,2\"); ignoring it", key, raw))
		codes = nil
	case len(bad) > 0:
		problems = append(problems, fmt.Sprintf(
			"annotation %s=%q: ignoring entries that are not integers: %s (want a comma-separated list of integers such as \"1,2\")",
			key, raw, strings.Join(bad, ", ")))
	}
	return codes, problems
}

// IsTerminalExitCode reports whether a failed container's exit code must fail
// the AppWrapper without retry (upstream's appwrapper_controller.go, Running
// phase): 0 never is; a code listed in terminalExitCodes is; when
// retryableExitCodes is set, a code it does not list is.
func (p Params) IsTerminalExitCode(code int32) bool {
	if code == 0 {
		return false
	}
	if slices.Contains(p.TerminalExitCodes, code) {
		return true
	}
	return p.RetryableExitCodes != nil && !slices.Contains(p.RetryableExitCodes, code)
}
