package appwrapper

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func TestDurationJSON(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		err  bool
	}{
		{in: `"90s"`, want: 90 * time.Second},
		{in: `"1h30m"`, want: 90 * time.Minute},
		{in: `" 1m "`, want: time.Minute},
		{in: `60000000000`, want: time.Minute},
		{in: `0`, want: 0},
		{in: `6e+10`, want: time.Minute},
		{in: `null`, want: 42}, // keeps the value it had
		{in: `"7d"`, err: true},
		{in: `"soon"`, err: true},
		{in: `1.5`, err: true},
		{in: `true`, err: true},
	} {
		d := Duration{42}
		err := json.Unmarshal([]byte(tc.in), &d)
		if tc.err {
			if err == nil {
				t.Errorf("%s: decoded to %v, want an error", tc.in, d.Duration)
			}
			continue
		}
		if err != nil || d.Duration != tc.want {
			t.Errorf("%s: got %v, %v; want %v", tc.in, d.Duration, err, tc.want)
		}
	}
	b, err := json.Marshal(Duration{90 * time.Second})
	if err != nil || string(b) != `"1m30s"` {
		t.Errorf("marshal: %s, %v", b, err)
	}
}

func TestDefaultConfig(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	ft := c.FaultTolerance
	for name, got := range map[string][2]time.Duration{
		"admission": {ft.AdmissionGracePeriod.Duration, time.Minute},
		"warmup":    {ft.WarmupGracePeriod.Duration, 5 * time.Minute},
		"failure":   {ft.FailureGracePeriod.Duration, time.Minute},
		"pause":     {ft.RetryPausePeriod.Duration, 90 * time.Second},
		"deletion":  {ft.ForcefulDeletionGracePeriod.Duration, 10 * time.Minute},
		"ceiling":   {ft.GracePeriodMaximum.Duration, 24 * time.Hour},
		"ttl":       {ft.SuccessTTL.Duration, 7 * 24 * time.Hour},
		"quarantne": {c.QuarantineTTL.Duration, time.Hour},
		"reeval":    {c.ReevaluatePeriod.Duration, 3 * time.Minute},
		"deadnode":  {c.DeadNodeGracePeriod.Duration, time.Minute},
	} {
		if got[0] != got[1] {
			t.Errorf("%s: %v, want %v", name, got[0], got[1])
		}
	}
	if ft.RetryLimit != 3 || !c.Autopilot.InjectAntiAffinities || !c.Autopilot.MonitorNodes ||
		!c.WebhooksEnabled || !c.UserRBACAdmissionCheck || c.DefaultQueueName != "" ||
		c.Autopilot.PreferNoScheduleWeight == nil || *c.Autopilot.PreferNoScheduleWeight != 50 {
		t.Errorf("defaults: %+v", c)
	}
	want := []corev1.Taint{
		{Key: "autopilot.ibm.com/gpuhealth", Value: "WARN", Effect: corev1.TaintEffectPreferNoSchedule},
		{Key: "autopilot.ibm.com/gpuhealth", Value: "TESTING", Effect: corev1.TaintEffectNoSchedule},
		{Key: "autopilot.ibm.com/gpuhealth", Value: "EVICT", Effect: corev1.TaintEffectNoExecute},
	}
	if got := c.Autopilot.ResourceTaints["nvidia.com/gpu"]; len(c.Autopilot.ResourceTaints) != 1 || !equalJSON(got, want) {
		t.Errorf("resource taints: %+v", c.Autopilot.ResourceTaints)
	}
	// Each call is a fresh value: no shared map between callers.
	DefaultConfig().Autopilot.ResourceTaints["x"] = nil
	if _, ok := DefaultConfig().Autopilot.ResourceTaints["x"]; ok {
		t.Error("DefaultConfig shares its map")
	}
}

func equalJSON(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

func TestLoadConfig(t *testing.T) {
	def := DefaultConfig()
	for _, tc := range []struct {
		name  string
		yaml  string
		check func(t *testing.T, c Config)
	}{
		{name: "empty", yaml: "", check: func(t *testing.T, c Config) {
			if !equalJSON(c, def) {
				t.Errorf("got %+v", c)
			}
		}},
		{name: "bare form, strings", yaml: `
faultTolerance:
  failureGracePeriod: 30s
  resetPause: 2m
  retryLimit: 5
schedulerName: coscheduler
quarantineTTL: 0s
reevaluatePeriod: 30s
deadNodeGracePeriod: 0s
`, check: func(t *testing.T, c Config) {
			ft := c.FaultTolerance
			if ft.FailureGracePeriod.Duration != 30*time.Second || ft.RetryPausePeriod.Duration != 2*time.Minute ||
				ft.RetryLimit != 5 || c.SchedulerName != "coscheduler" || c.QuarantineTTL.Duration != 0 ||
				c.ReevaluatePeriod.Duration != 30*time.Second || c.DeadNodeGracePeriod.Duration != 0 {
				t.Errorf("got %+v", c)
			}
			// Keys left out keep their defaults.
			if ft.WarmupGracePeriod != def.FaultTolerance.WarmupGracePeriod || !c.Autopilot.MonitorNodes {
				t.Errorf("defaults lost: %+v", c)
			}
		}},
		{name: "upstream layout, nanoseconds", yaml: `
appwrapper:
  userRBACAdmissionCheck: true
  defaultQueueName: default-queue
  faultTolerance:
    admissionGracePeriod: 60000000000
    warmupGracePeriod: 600000000000
    gracePeriodCeiling: 86400000000000
    successTTLCeiling: 3600000000000
    deletionGracePeriod: 1m
  autopilot:
    monitorNodes: false
    preferNoScheduleWeight: 10
certManagement:
  namespace: appwrapper-system
controllerManager:
  health:
    bindAddress: ":8081"
webhooksEnabled: true
`, check: func(t *testing.T, c Config) {
			ft := c.FaultTolerance
			if ft.AdmissionGracePeriod.Duration != time.Minute || ft.WarmupGracePeriod.Duration != 10*time.Minute ||
				ft.SuccessTTL.Duration != time.Hour || ft.ForcefulDeletionGracePeriod.Duration != time.Minute {
				t.Errorf("got %+v", ft)
			}
			if c.Autopilot.MonitorNodes || !c.Autopilot.InjectAntiAffinities || *c.Autopilot.PreferNoScheduleWeight != 10 {
				t.Errorf("autopilot %+v", c.Autopilot)
			}
			// The webhook's keys, webhooksEnabled beside "appwrapper:".
			if !c.WebhooksEnabled || !c.UserRBACAdmissionCheck || c.DefaultQueueName != "default-queue" {
				t.Errorf("webhook keys: enabled %v, rbac %v, queue %q", c.WebhooksEnabled, c.UserRBACAdmissionCheck, c.DefaultQueueName)
			}
		}},
		{name: "webhook keys off", yaml: "appwrapper:\n  userRBACAdmissionCheck: false\nwebhooksEnabled: false\n", check: func(t *testing.T, c Config) {
			if c.WebhooksEnabled || c.UserRBACAdmissionCheck {
				t.Errorf("webhook keys: enabled %v, rbac %v", c.WebhooksEnabled, c.UserRBACAdmissionCheck)
			}
		}},
		{name: "resource taints merge per resource", yaml: `
autopilot:
  resourceTaints:
    example.com/fpga:
    - key: fpga-health
      value: BAD
      effect: NoExecute
`, check: func(t *testing.T, c Config) {
			rt := c.Autopilot.ResourceTaints
			if len(rt) != 2 || len(rt["nvidia.com/gpu"]) != 3 || len(rt["example.com/fpga"]) != 1 ||
				rt["example.com/fpga"][0].Effect != corev1.TaintEffectNoExecute {
				t.Errorf("got %+v", rt)
			}
		}},
		{name: "a resource's list replaced, and removed", yaml: `
autopilot:
  resourceTaints:
    nvidia.com/gpu: []
`, check: func(t *testing.T, c Config) {
			if l := c.Autopilot.ResourceTaints["nvidia.com/gpu"]; len(l) != 0 {
				t.Errorf("got %+v", l)
			}
		}},
		{name: "json", yaml: `{"faultTolerance": {"retryLimit": 0}}`, check: func(t *testing.T, c Config) {
			if c.FaultTolerance.RetryLimit != 0 {
				t.Errorf("got %+v", c.FaultTolerance)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := LoadConfig([]byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

func TestLoadConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []string // substrings of the error
	}{
		{"not yaml", "faultTolerance: [", []string{"appwrapper config"}},
		{"not a mapping", "- 1\n- 2", []string{"mapping"}},
		{"bad duration", "faultTolerance:\n  failureGracePeriod: 7d", []string{`faultTolerance.failureGracePeriod: duration "7d"`, "Go duration"}},
		{"misspelt key", "faultTolerance:\n  failureGrace: 1m", []string{"faultTolerance.failureGrace: unknown key"}},
		{"misspelt autopilot key", "autopilot:\n  injectAntiAffinity: false", []string{"autopilot.injectAntiAffinity: unknown key"}},
		{"both layouts", "appwrapper: {}\nfaultTolerance: {}", []string{"both"}},
		{"above ceiling", "faultTolerance:\n  warmupGracePeriod: 25h", []string{"warmupGracePeriod 25h0m0s", "[0, gracePeriodCeiling 24h0m0s]"}},
		{"ceiling lowered", "faultTolerance:\n  gracePeriodCeiling: 2m", []string{"warmupGracePeriod 5m0s", "deletionGracePeriod 10m0s"}},
		{"negative", "faultTolerance:\n  resetPause: -1s", []string{"resetPause -1s"}},
		{"admission above warmup", "faultTolerance:\n  admissionGracePeriod: 10m", []string{"admissionGracePeriod 10m0s: must be <= warmupGracePeriod 5m0s"}},
		{"ttl zero", "faultTolerance:\n  successTTLCeiling: 0", []string{"successTTLCeiling 0s: must be > 0"}},
		{"weight", "autopilot:\n  preferNoScheduleWeight: 0", []string{"preferNoScheduleWeight 0: must be in [1, 100]"}},
		{"effect", "autopilot:\n  resourceTaints:\n    x: [{key: k, value: v, effect: Evict}]", []string{`effect "Evict"`}},
		{"taint key", "autopilot:\n  resourceTaints:\n    x: [{value: v, effect: NoExecute}]", []string{"key must not be empty"}},
		{"quarantine format", "quarantineTTL: 1 hour", []string{`quarantineTTL: duration "1 hour"`}},
		{"weight type", "autopilot:\n  preferNoScheduleWeight: high", []string{"autopilot.preferNoScheduleWeight"}},
		{"quarantine", "quarantineTTL: -1m", []string{"quarantineTTL -1m0s"}},
		{"reevaluate", "reevaluatePeriod: -1s", []string{"reevaluatePeriod -1s: must be >= 0 (0 disables)"}},
		{"dead node", "deadNodeGracePeriod: -1s", []string{"deadNodeGracePeriod -1s: must be >= 0"}},
		{"upstream layout validated", "appwrapper:\n  faultTolerance:\n    successTTLCeiling: -1s", []string{"successTTLCeiling"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadConfig([]byte(tc.yaml))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// The defaults, marshalled (as a controller writes a missing ConfigMap),
// load back unchanged.
func TestConfigRoundTrip(t *testing.T) {
	c := DefaultConfig()
	c.SchedulerName = "coscheduler"
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"successTTLCeiling":"168h0m0s"`) {
		t.Errorf("marshalled %s", b)
	}
	got, err := LoadConfig(b)
	if err != nil || !equalJSON(got, c) {
		t.Errorf("got %+v, %v", got, err)
	}
}
