package appwrapper

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
)

// AvoidNodesAnnotation records, on the AppWrapper, the hosts ft-launcher
// quarantined (its verdicts' quarantined entries) and until when the
// workload's recreated pods keep off them: a JSON object host → RFC 3339
// expiry. It is state that must survive a controller restart, and an
// annotation lets a person read or clear it.
const AvoidNodesAnnotation = "ft-launcher.dev/avoid-nodes"

// avoidList reads the annotation, dropping malformed and expired entries.
func avoidList(aw *v1beta2.AppWrapper, now time.Time) map[string]time.Time {
	out := map[string]time.Time{}
	raw := aw.GetAnnotations()[AvoidNodesAnnotation]
	if raw == "" {
		return out
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return out
	}
	for host, until := range m {
		t, err := time.Parse(time.RFC3339, until)
		if err != nil || !t.After(now) || strings.TrimSpace(host) == "" {
			continue
		}
		out[host] = t
	}
	return out
}

// avoidedHosts are the hosts recreated pods must keep off now, sorted.
func avoidedHosts(aw *v1beta2.AppWrapper, now time.Time) []string {
	return slices.Sorted(maps.Keys(avoidList(aw, now)))
}

// recordQuarantine adds the hosts quarantined by the workload's launchers
// to the annotation, each avoided for Config.QuarantineTTL from when it is
// first seen, and drops expired entries. A host already listed keeps its
// expiry: failed pods stay until the reset, and would otherwise extend it
// on every pass.
func (s *pass) recordQuarantine(ctx context.Context, hosts []string) error {
	ttl := s.r.config.QuarantineTTL.Duration
	if len(hosts) == 0 || ttl <= 0 {
		return nil
	}
	now := s.r.now()
	m := avoidList(s.aw, now)
	var added []string
	for _, h := range hosts {
		if _, ok := m[h]; ok || strings.TrimSpace(h) == "" {
			continue
		}
		m[h] = now.Add(ttl)
		added = append(added, h)
	}
	if len(added) == 0 {
		return nil
	}
	enc := map[string]string{}
	for h, t := range m {
		enc[h] = t.UTC().Format(time.RFC3339)
	}
	b, err := json.Marshal(enc)
	if err != nil {
		return fmt.Errorf("encode %s: %w", AvoidNodesAnnotation, err)
	}
	patch := client.MergeFrom(s.aw.DeepCopy())
	ann := maps.Clone(s.aw.GetAnnotations())
	if ann == nil {
		ann = map[string]string{}
	}
	ann[AvoidNodesAnnotation] = string(b)
	s.aw.SetAnnotations(ann)
	if err := s.r.client.Patch(ctx, s.aw, patch); err != nil {
		return fmt.Errorf("record quarantined hosts on AppWrapper %s/%s: %w", s.aw.Namespace, s.aw.Name, err)
	}
	// The response replaced the object; its status is the one we read.
	s.orig = *s.aw.Status.DeepCopy()
	s.r.recorder.Eventf(s.aw, nil, corev1.EventTypeNormal, ReasonAvoidNodes, "Quarantine",
		"ft-launcher quarantined %s; recreated pods avoid them for %v", strings.Join(added, ", "), ttl)
	return nil
}
