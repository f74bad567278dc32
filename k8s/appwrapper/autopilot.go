package appwrapper

import (
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
)

// NoExecuteResources returns, sorted, the resources for which node carries
// a NoExecute Autopilot label: a label key=value matching one of the
// resource's NoExecute entries in ap.ResourceTaints (upstream's node_health_monitor.go;
// Autopilot's "taints" are node labels, not spec.taints). Running pods on
// the node that request one of them get their workload reset.
func NoExecuteResources(node *corev1.Node, ap AutopilotConfig) []string {
	if node == nil {
		return nil
	}
	var out []string
	for r, taints := range ap.ResourceTaints {
		for _, t := range taints {
			if t.Effect != corev1.TaintEffectNoExecute {
				continue
			}
			if v, ok := node.Labels[t.Key]; ok && v == t.Value {
				out = append(out, r)
				break
			}
		}
	}
	sort.Strings(out)
	return out
}

// requestsResource reports whether a container or init container of spec
// asks for a non-zero quantity of r, in limits or requests (as upstream's
// resource_management.go: only such pods are steered away from, or evicted off, flagged nodes).
func requestsResource(spec *corev1.PodSpec, r corev1.ResourceName) bool {
	check := func(cs []corev1.Container) bool {
		for i := range cs {
			res := cs[i].Resources
			if q, ok := res.Limits[r]; ok && !q.IsZero() {
				return true
			}
			if q, ok := res.Requests[r]; ok && !q.IsZero() {
				return true
			}
		}
		return false
	}
	return check(spec.Containers) || check(spec.InitContainers)
}

// autopilotAffinity is what Autopilot injection adds to a pod template
// (upstream's resource_management.go): for each configured resource the template requests,
// the NoSchedule and NoExecute label values become required NotIn
// expressions and the PreferNoSchedule ones one preferred term. Resources
// are taken in sorted order and values deduplicated, so the result does
// not depend on map order.
func autopilotAffinity(spec *corev1.PodSpec, ap AutopilotConfig) ([]corev1.NodeSelectorRequirement, *corev1.PreferredSchedulingTerm) {
	if !ap.InjectAntiAffinities {
		return nil, nil
	}
	resources := make([]string, 0, len(ap.ResourceTaints))
	for r := range ap.ResourceTaints {
		resources = append(resources, r)
	}
	sort.Strings(resources)

	var reqKeys, prefKeys []string
	reqVals, prefVals := map[string][]string{}, map[string][]string{}
	add := func(keys *[]string, vals map[string][]string, t corev1.Taint) {
		if _, seen := vals[t.Key]; !seen {
			*keys = append(*keys, t.Key)
		}
		if !slices.Contains(vals[t.Key], t.Value) {
			vals[t.Key] = append(vals[t.Key], t.Value)
		}
	}
	for _, r := range resources {
		if !requestsResource(spec, corev1.ResourceName(r)) {
			continue
		}
		for _, t := range ap.ResourceTaints[r] {
			switch t.Effect {
			case corev1.TaintEffectNoSchedule, corev1.TaintEffectNoExecute:
				add(&reqKeys, reqVals, t)
			case corev1.TaintEffectPreferNoSchedule:
				add(&prefKeys, prefVals, t)
			}
		}
	}

	var required []corev1.NodeSelectorRequirement
	for _, k := range reqKeys {
		required = append(required, corev1.NodeSelectorRequirement{Key: k, Operator: corev1.NodeSelectorOpNotIn, Values: reqVals[k]})
	}
	if len(prefKeys) == 0 {
		return required, nil
	}
	weight := int32(1) // upstream's value when the weight is unset
	if ap.PreferNoScheduleWeight != nil {
		weight = *ap.PreferNoScheduleWeight
	}
	preferred := &corev1.PreferredSchedulingTerm{Weight: weight}
	for _, k := range prefKeys {
		preferred.Preference.MatchExpressions = append(preferred.Preference.MatchExpressions,
			corev1.NodeSelectorRequirement{Key: k, Operator: corev1.NodeSelectorOpNotIn, Values: prefVals[k]})
	}
	return required, preferred
}
