package appwrapper

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	yamlutil "k8s.io/apimachinery/pkg/util/yaml"
)

// Duration is a time.Duration in the operator configuration. Upstream's
// fields are plain time.Duration, so its files carry integer nanoseconds
// (upstream's pkg/config/config.go); people write "90s". Both decode; it encodes as the
// string form.
type Duration struct{ time.Duration }

// MarshalJSON writes the duration as a Go duration string ("1m30s").
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(d.Duration.String())
}

// UnmarshalJSON reads a Go duration string or an integer number of
// nanoseconds; null leaves the value as it was (the default).
func (d *Duration) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("duration: %w", err)
		}
		v, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("duration %q: want a Go duration such as \"90s\" or \"1h30m\", or integer nanoseconds", s)
		}
		d.Duration = v
		return nil
	}
	if n, err := strconv.ParseInt(string(b), 10, 64); err == nil {
		d.Duration = time.Duration(n)
		return nil
	}
	// YAML may turn a large integer into 6e+10; accept it when integral.
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || f != math.Trunc(f) || math.Abs(f) > math.MaxInt64 {
		return fmt.Errorf("duration %s: want a Go duration such as \"90s\" or \"1h30m\", or integer nanoseconds", b)
	}
	d.Duration = time.Duration(f)
	return nil
}

// FaultToleranceConfig holds the operator-wide fault-tolerance defaults
// (docs/kubernetes.md, "The contract"; upstream's pkg/config/config.go). The
// YAML keys are upstream's, which differ from the Go names for four of them.
type FaultToleranceConfig struct {
	AdmissionGracePeriod        Duration `json:"admissionGracePeriod"`
	WarmupGracePeriod           Duration `json:"warmupGracePeriod"`
	FailureGracePeriod          Duration `json:"failureGracePeriod"`
	RetryPausePeriod            Duration `json:"resetPause"`
	RetryLimit                  int32    `json:"retryLimit"`
	ForcefulDeletionGracePeriod Duration `json:"deletionGracePeriod"`
	GracePeriodMaximum          Duration `json:"gracePeriodCeiling"`
	SuccessTTL                  Duration `json:"successTTLCeiling"`
}

// AutopilotConfig is the IBM Autopilot integration (upstream's pkg/config/config.go).
// ResourceTaints are node *labels* key=value, classified by Effect, per
// resource name.
type AutopilotConfig struct {
	InjectAntiAffinities   bool                      `json:"injectAntiAffinities"`
	MonitorNodes           bool                      `json:"monitorNodes"`
	ResourceTaints         map[string][]corev1.Taint `json:"resourceTaints"`
	PreferNoScheduleWeight *int32                    `json:"preferNoScheduleWeight"`
}

// Config is the operator configuration.
type Config struct {
	FaultTolerance FaultToleranceConfig `json:"faultTolerance"`
	Autopilot      AutopilotConfig      `json:"autopilot"`
	// SchedulerName is set on pod templates that name none.
	SchedulerName string `json:"schedulerName,omitempty"`
	// QuarantineTTL is how long a node that ft-launcher quarantined is
	// avoided by recreated pods (ours, not upstream's); 0 disables it.
	QuarantineTTL Duration `json:"quarantineTTL"`
	// ReevaluatePeriod (ours) is the safety-net pass of a Running
	// AppWrapper: watch events drive every decision at once, and this
	// periodic pass catches one that was missed. 0 disables it.
	ReevaluatePeriod Duration `json:"reevaluatePeriod"`
	// DeadNodeGracePeriod (ours): during a deletion (reset, suspension,
	// failure, AppWrapper deleted), a labelled pod on a node whose Ready
	// condition has not been True for this long (or that carries the
	// node controller's unreachable taint for this long) is deleted with
	// grace 0 at once, instead of after deletionGracePeriod: no kubelet
	// is there to finish it. A node with the out-of-service taint counts
	// at once.
	DeadNodeGracePeriod Duration `json:"deadNodeGracePeriod"`
	// WebhooksEnabled serves the admission webhook (webhook.go) from the
	// controller. Upstream's key and default (true); in its layout it sits
	// beside "appwrapper:", not under it. Without the webhook, whoever may
	// create AppWrappers may have the controller create anything its
	// ClusterRole allows (Secrets, bare Pods): the per-component
	// SubjectAccessReview is what stops that.
	WebhooksEnabled bool `json:"webhooksEnabled"`
	// UserRBACAdmissionCheck: the webhook asks, per component, whether the
	// requesting user may create it (upstream's key and default).
	UserRBACAdmissionCheck bool `json:"userRBACAdmissionCheck"`
	// DefaultQueueName: the webhook labels an AppWrapper that names no
	// Kueue queue with this one (upstream's key).
	DefaultQueueName string `json:"defaultQueueName,omitempty"`
}

// Autopilot's GPU health label and the resource whose health it reports.
const (
	autopilotHealthLabel = "autopilot.ibm.com/gpuhealth"
	gpuResource          = "nvidia.com/gpu"
)

// DefaultConfig returns upstream's defaults. The Autopilot taints are the code's
// (WARN, TESTING, EVICT), not the docs' (upstream's pkg/config/config.go; its
// docs list others).
func DefaultConfig() Config {
	weight := int32(50)
	return Config{
		FaultTolerance: FaultToleranceConfig{
			AdmissionGracePeriod:        Duration{time.Minute},
			WarmupGracePeriod:           Duration{5 * time.Minute},
			FailureGracePeriod:          Duration{time.Minute},
			RetryPausePeriod:            Duration{90 * time.Second},
			RetryLimit:                  3,
			ForcefulDeletionGracePeriod: Duration{10 * time.Minute},
			GracePeriodMaximum:          Duration{24 * time.Hour},
			SuccessTTL:                  Duration{7 * 24 * time.Hour},
		},
		Autopilot: AutopilotConfig{
			InjectAntiAffinities: true,
			MonitorNodes:         true,
			ResourceTaints: map[string][]corev1.Taint{
				gpuResource: {
					{Key: autopilotHealthLabel, Value: "WARN", Effect: corev1.TaintEffectPreferNoSchedule},
					{Key: autopilotHealthLabel, Value: "TESTING", Effect: corev1.TaintEffectNoSchedule},
					{Key: autopilotHealthLabel, Value: "EVICT", Effect: corev1.TaintEffectNoExecute},
				},
			},
			PreferNoScheduleWeight: &weight,
		},
		QuarantineTTL:       Duration{time.Hour},
		ReevaluatePeriod:    Duration{3 * time.Minute},
		DeadNodeGracePeriod: Duration{time.Minute},
		// Upstream's default.
		WebhooksEnabled:        true,
		UserRBACAdmissionCheck: true,
	}
}

// upstreamKey is the top-level key of upstream's operator config file
// (OperatorConfig.appwrapper, upstream's pkg/config/config.go).
const upstreamKey = "appwrapper"

// LoadConfig decodes YAML (or JSON) over DefaultConfig, so keys left out
// keep their defaults, and validates the result. It accepts the bare form
// (faultTolerance, autopilot, ... at the top) and upstream's file, where
// they sit under "appwrapper:" beside keys this controller ignores
// (certManagement, controllerManager, ...) and webhooksEnabled.
//
// As with upstream's decoder, resourceTaints merges per resource over the
// default map: naming "nvidia.com/gpu" replaces its list, "nvidia.com/gpu: []"
// empties it, another resource is added beside it.
func LoadConfig(data []byte) (Config, error) {
	cfg := DefaultConfig()
	js, err := yamlutil.ToJSON(data)
	if err != nil {
		return Config{}, fmt.Errorf("appwrapper config: %w", err)
	}
	if len(bytes.TrimSpace(js)) == 0 || bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
		return cfg, cfg.Validate()
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(js, &top); err != nil {
		return Config{}, fmt.Errorf("appwrapper config: want a mapping at the top: %w", err)
	}
	body := js
	if inner, ok := top[upstreamKey]; ok {
		for _, k := range []string{"faultTolerance", "autopilot"} {
			if _, both := top[k]; both {
				return Config{}, fmt.Errorf("appwrapper config: %q is both at the top and under %q; use one layout", k, upstreamKey)
			}
		}
		body = inner
		if raw, ok := top["webhooksEnabled"]; ok {
			// Upstream's OperatorConfig keeps it outside "appwrapper:".
			if err := json.Unmarshal(raw, &cfg.WebhooksEnabled); err != nil {
				return Config{}, fmt.Errorf("appwrapper config: webhooksEnabled: want true or false: %w", err)
			}
		}
	}
	// Key by key first, so that an error names its key and a misspelt key,
	// which would otherwise silently keep its default, is refused.
	if err := checkKeys(body); err != nil {
		return Config{}, fmt.Errorf("appwrapper config: %w", err)
	}
	if err := json.Unmarshal(body, &cfg); err != nil {
		return Config{}, fmt.Errorf("appwrapper config: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// checkKeys decodes each key of the config's own sections on its own, so
// that a decoding error names the key. Keys under faultTolerance and
// autopilot must be known; other keys at the top are decoded leniently
// (upstream's layout has keys this controller ignores).
func checkKeys(body []byte) error {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return err
	}
	sections := []struct {
		key  string
		into func() any
	}{
		{"faultTolerance", func() any { return &FaultToleranceConfig{} }},
		{"autopilot", func() any { return &AutopilotConfig{} }},
	}
	for _, sec := range sections {
		raw, ok := top[sec.key]
		if !ok || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			continue
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(raw, &fields); err != nil {
			return fmt.Errorf("%s: want a mapping", sec.key)
		}
		if err := decodeEach(sec.key+".", fields, sec.into(), true); err != nil {
			return err
		}
		delete(top, sec.key)
	}
	return decodeEach("", top, &Config{}, false)
}

// decodeEach decodes {key: value} into into for each key, naming the key
// in any error; with strict an unknown key is an error.
func decodeEach(prefix string, fields map[string]json.RawMessage, into any, strict bool) error {
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		one, err := json.Marshal(map[string]json.RawMessage{k: fields[k]})
		if err != nil {
			return fmt.Errorf("%s%s: %w", prefix, k, err)
		}
		dec := json.NewDecoder(bytes.NewReader(one))
		if strict {
			dec.DisallowUnknownFields()
		}
		if err := dec.Decode(into); err != nil {
			if strings.Contains(err.Error(), "unknown field") {
				return fmt.Errorf("%s%s: unknown key", prefix, k)
			}
			return fmt.Errorf("%s%s: %w", prefix, k, err)
		}
	}
	return nil
}

// Validate applies upstream's rules (docs/kubernetes.md, "The contract": no grace period
// above gracePeriodCeiling, admissionGracePeriod <= warmupGracePeriod,
// successTTLCeiling > 0) and rejects what would make every workload fail at
// creation or misbehave: negative durations, a preferNoScheduleWeight
// outside the API's 1..100, an Autopilot taint with no key or an unknown
// effect. All problems are reported together.
func (c Config) Validate() error {
	var errs []error
	ft := c.FaultTolerance
	ceiling := ft.GracePeriodMaximum.Duration
	if ceiling < 0 {
		errs = append(errs, fmt.Errorf("faultTolerance.gracePeriodCeiling %v: must be >= 0", ceiling))
	}
	graces := []struct {
		key string
		d   time.Duration
	}{
		{"admissionGracePeriod", ft.AdmissionGracePeriod.Duration},
		{"warmupGracePeriod", ft.WarmupGracePeriod.Duration},
		{"failureGracePeriod", ft.FailureGracePeriod.Duration},
		{"resetPause", ft.RetryPausePeriod.Duration},
		{"deletionGracePeriod", ft.ForcefulDeletionGracePeriod.Duration},
	}
	for _, g := range graces {
		if g.d < 0 || (ceiling >= 0 && g.d > ceiling) {
			errs = append(errs, fmt.Errorf("faultTolerance.%s %v: must be in [0, gracePeriodCeiling %v]", g.key, g.d, ceiling))
		}
	}
	if ft.AdmissionGracePeriod.Duration > ft.WarmupGracePeriod.Duration {
		errs = append(errs, fmt.Errorf("faultTolerance.admissionGracePeriod %v: must be <= warmupGracePeriod %v",
			ft.AdmissionGracePeriod.Duration, ft.WarmupGracePeriod.Duration))
	}
	if ft.SuccessTTL.Duration <= 0 {
		errs = append(errs, fmt.Errorf("faultTolerance.successTTLCeiling %v: must be > 0", ft.SuccessTTL.Duration))
	}
	if w := c.Autopilot.PreferNoScheduleWeight; w != nil && (*w < 1 || *w > 100) {
		errs = append(errs, fmt.Errorf("autopilot.preferNoScheduleWeight %d: must be in [1, 100]", *w))
	}
	resources := make([]string, 0, len(c.Autopilot.ResourceTaints))
	for r := range c.Autopilot.ResourceTaints {
		resources = append(resources, r)
	}
	sort.Strings(resources)
	for _, r := range resources {
		for i, t := range c.Autopilot.ResourceTaints[r] {
			if t.Key == "" {
				errs = append(errs, fmt.Errorf("autopilot.resourceTaints[%q][%d]: key must not be empty", r, i))
			}
			switch t.Effect {
			case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
			default:
				errs = append(errs, fmt.Errorf("autopilot.resourceTaints[%q][%d].effect %q: must be NoSchedule, PreferNoSchedule or NoExecute", r, i, t.Effect))
			}
		}
	}
	if c.QuarantineTTL.Duration < 0 {
		errs = append(errs, fmt.Errorf("quarantineTTL %v: must be >= 0 (0 disables)", c.QuarantineTTL.Duration))
	}
	if c.ReevaluatePeriod.Duration < 0 {
		errs = append(errs, fmt.Errorf("reevaluatePeriod %v: must be >= 0 (0 disables)", c.ReevaluatePeriod.Duration))
	}
	if c.DeadNodeGracePeriod.Duration < 0 {
		errs = append(errs, fmt.Errorf("deadNodeGracePeriod %v: must be >= 0", c.DeadNodeGracePeriod.Duration))
	}
	if len(errs) > 0 {
		return fmt.Errorf("appwrapper config: %w", errors.Join(errs...))
	}
	return nil
}
