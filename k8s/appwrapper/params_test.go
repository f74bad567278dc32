package appwrapper

import (
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
)

func awWithAnnotations(ann map[string]string) *v1beta2.AppWrapper {
	return &v1beta2.AppWrapper{ObjectMeta: metav1.ObjectMeta{Name: "aw", Namespace: "ns", Annotations: ann}}
}

func TestParamsFor(t *testing.T) {
	ft := DefaultConfig().FaultTolerance
	defaults := Params{
		AdmissionGracePeriod:        time.Minute,
		WarmupGracePeriod:           5 * time.Minute,
		FailureGracePeriod:          time.Minute,
		RetryPausePeriod:            90 * time.Second,
		ForcefulDeletionGracePeriod: 10 * time.Minute,
		SuccessTTL:                  7 * 24 * time.Hour,
		RetryLimit:                  3,
	}
	with := func(f func(p *Params)) Params {
		p := defaults
		f(&p)
		return p
	}
	for _, tc := range []struct {
		name     string
		ann      map[string]string
		want     Params
		problems []string // one substring per expected problem, in order
	}{
		{name: "defaults", want: defaults},
		{name: "overrides", ann: map[string]string{
			v1beta2.AdmissionGracePeriodDurationAnnotation: "10s",
			v1beta2.WarmupGracePeriodDurationAnnotation:    "1m",
			v1beta2.FailureGracePeriodDurationAnnotation:   "0s",
			v1beta2.RetryPausePeriodDurationAnnotation:     "5s",
			v1beta2.ForcefulDeletionGracePeriodAnnotation:  "2m",
			v1beta2.DeletionOnFailureGracePeriodAnnotation: "1h30m",
			v1beta2.SuccessTTLAnnotation:                   "1h",
			v1beta2.RetryLimitAnnotation:                   "7",
		}, want: Params{
			AdmissionGracePeriod: 10 * time.Second, WarmupGracePeriod: time.Minute, FailureGracePeriod: 0,
			RetryPausePeriod: 5 * time.Second, ForcefulDeletionGracePeriod: 2 * time.Minute,
			DeletionOnFailureGracePeriod: 90 * time.Minute, SuccessTTL: time.Hour, RetryLimit: 7,
		}},
		{name: "spaces tolerated", ann: map[string]string{
			v1beta2.FailureGracePeriodDurationAnnotation: " 30s ",
			v1beta2.RetryLimitAnnotation:                 " 1",
		}, want: with(func(p *Params) { p.FailureGracePeriod = 30 * time.Second; p.RetryLimit = 1 })},
		{name: "clamped above the maximum", ann: map[string]string{
			v1beta2.WarmupGracePeriodDurationAnnotation:    "48h",
			v1beta2.DeletionOnFailureGracePeriodAnnotation: "100h",
			v1beta2.ForcefulDeletionGracePeriodAnnotation:  "25h",
		}, want: with(func(p *Params) {
			p.WarmupGracePeriod = 24 * time.Hour
			p.DeletionOnFailureGracePeriod = 24 * time.Hour
			p.ForcefulDeletionGracePeriod = 24 * time.Hour
		})},
		{name: "negative is 0", ann: map[string]string{
			v1beta2.FailureGracePeriodDurationAnnotation: "-5m",
			v1beta2.RetryPausePeriodDurationAnnotation:   "-1s",
		}, want: with(func(p *Params) { p.FailureGracePeriod = 0; p.RetryPausePeriod = 0 })},
		{name: "retry limit not clamped", ann: map[string]string{v1beta2.RetryLimitAnnotation: "-2"},
			want: with(func(p *Params) { p.RetryLimit = -2 })},
		{name: "retry limit large", ann: map[string]string{v1beta2.RetryLimitAnnotation: "1000000"},
			want: with(func(p *Params) { p.RetryLimit = 1000000 })},
		{name: "success TTL at the ceiling keeps the ceiling", ann: map[string]string{v1beta2.SuccessTTLAnnotation: "168h"}, want: defaults},
		{name: "success TTL above the ceiling keeps the ceiling", ann: map[string]string{v1beta2.SuccessTTLAnnotation: "400h"}, want: defaults},
		{name: "success TTL 0 keeps the ceiling", ann: map[string]string{v1beta2.SuccessTTLAnnotation: "0s"}, want: defaults},
		{name: "success TTL negative keeps the ceiling", ann: map[string]string{v1beta2.SuccessTTLAnnotation: "-1h"}, want: defaults},
		{name: "malformed values use the default and are reported", ann: map[string]string{
			v1beta2.AdmissionGracePeriodDurationAnnotation: "1 minute",
			v1beta2.FailureGracePeriodDurationAnnotation:   "60",
			v1beta2.RetryLimitAnnotation:                   "three",
			v1beta2.SuccessTTLAnnotation:                   "1d",
			v1beta2.DeletionOnFailureGracePeriodAnnotation: "",
		}, want: defaults, problems: []string{
			`admissionGracePeriodDuration="1 minute" is not a duration`,
			`failureGracePeriodDuration="60" is not a duration`,
			`deletionOnFailureGracePeriodDuration="" is not a duration`,
			`successTTLDuration="1d" is not a duration`,
			`retryLimit="three" is not an integer`,
		}},
		{name: "retry limit beyond int32", ann: map[string]string{v1beta2.RetryLimitAnnotation: "3000000000"},
			want: defaults, problems: []string{`retryLimit="3000000000"`}},
		{name: "exit codes with spaces", ann: map[string]string{
			v1beta2.TerminalExitCodesAnnotation:  "1, 2 ,3",
			v1beta2.RetryableExitCodesAnnotation: "137,143",
		}, want: with(func(p *Params) {
			p.TerminalExitCodes = []int32{1, 2, 3}
			p.RetryableExitCodes = []int32{137, 143}
		})},
		{name: "exit codes: bad entries reported, good ones kept", ann: map[string]string{
			v1beta2.TerminalExitCodesAnnotation: "1,x,,2,1",
		}, want: with(func(p *Params) { p.TerminalExitCodes = []int32{1, 2} }),
			problems: []string{`terminalExitCodes="1,x,,2,1": ignoring entries that are not integers: "x", ""`}},
		{name: "exit codes: nothing valid is unset", ann: map[string]string{
			v1beta2.RetryableExitCodesAnnotation: "none",
			v1beta2.TerminalExitCodesAnnotation:  " ",
		}, want: defaults, problems: []string{
			`terminalExitCodes=" " has no exit code`,
			`retryableExitCodes="none" has no exit code`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, problems := ParamsFor(awWithAnnotations(tc.ann), ft)
			if !equalParams(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
			if len(problems) != len(tc.problems) {
				t.Fatalf("problems %q, want %d", problems, len(tc.problems))
			}
			for i, w := range tc.problems {
				if !strings.Contains(problems[i], w) {
					t.Errorf("problem %q does not contain %q", problems[i], w)
				}
			}
		})
	}
}

// equalParams tells a nil exit-code list (unset) from an empty one.
func equalParams(a, b Params) bool { return reflect.DeepEqual(a, b) }

func TestParamsForClampsToConfiguredCeiling(t *testing.T) {
	ft := DefaultConfig().FaultTolerance
	ft.GracePeriodMaximum = Duration{time.Hour}
	ft.SuccessTTL = Duration{2 * time.Hour}
	p, problems := ParamsFor(awWithAnnotations(map[string]string{
		v1beta2.FailureGracePeriodDurationAnnotation: "90m",
		v1beta2.SuccessTTLAnnotation:                 "90m", // below SuccessTTL: honoured, ceiling not applied
	}), ft)
	if len(problems) != 0 || p.FailureGracePeriod != time.Hour || p.SuccessTTL != 90*time.Minute {
		t.Errorf("got %+v %q", p, problems)
	}
	// The problem message says what is allowed.
	_, problems = ParamsFor(awWithAnnotations(map[string]string{v1beta2.WarmupGracePeriodDurationAnnotation: "x"}), ft)
	if len(problems) != 1 || !strings.Contains(problems[0], "at most 1h0m0s") || !strings.Contains(problems[0], "default 5m0s") {
		t.Errorf("problems %q", problems)
	}
}

func TestIsTerminalExitCode(t *testing.T) {
	for _, tc := range []struct {
		name                string
		terminal, retryable []int32
		code                int32
		want                bool
	}{
		{name: "no annotations", code: 1},
		{name: "zero never", terminal: []int32{0}, retryable: []int32{}, code: 0},
		{name: "listed terminal", terminal: []int32{3, 4}, code: 4, want: true},
		{name: "not listed terminal", terminal: []int32{3, 4}, code: 5},
		{name: "retryable listed", retryable: []int32{137}, code: 137},
		{name: "retryable set, not listed", retryable: []int32{137}, code: 1, want: true},
		{name: "terminal wins over retryable", terminal: []int32{137}, retryable: []int32{137}, code: 137, want: true},
		{name: "empty retryable set", retryable: []int32{}, code: 2, want: true},
	} {
		p := Params{TerminalExitCodes: tc.terminal, RetryableExitCodes: tc.retryable}
		if got := p.IsTerminalExitCode(tc.code); got != tc.want {
			t.Errorf("%s: IsTerminalExitCode(%d) = %v", tc.name, tc.code, got)
		}
	}
}
