package appwrapper

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/ftlauncher/ft-launcher/k8s"
	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
)

// hostnameLabel is the well-known node label that AvoidNodes match.
const hostnameLabel = corev1.LabelHostname

// InjectOptions is what BuildComponent adds beyond the AppWrapper itself.
type InjectOptions struct {
	// SchedulerName is set on pod templates that name none.
	SchedulerName string
	// Autopilot drives the anti-affinity injection (upstream's resource_management.go).
	Autopilot AutopilotConfig
	// AvoidNodes are host names the launchers quarantined (not expired):
	// every pod of the workload gets a required NotIn on
	// kubernetes.io/hostname for them.
	AvoidNodes []string
}

// FatalError marks an error that must fail the AppWrapper without retry:
// creating the component again would fail the same way (a template that
// does not decode, a conflicting label, annotation or nodeSelector key,
// a pod-set path that leads nowhere).
type FatalError struct{ Err error }

func (e *FatalError) Error() string { return e.Err.Error() }
func (e *FatalError) Unwrap() error { return e.Err }

// IsFatal reports whether err is, or wraps, a *FatalError.
func IsFatal(err error) bool {
	var fe *FatalError
	return errors.As(err, &fe)
}

func fatalf(format string, args ...any) error {
	return &FatalError{Err: fmt.Errorf(format, args...)}
}

// BuildComponent returns the object to create for spec.components[idx]
// (upstream's resource_management.go): the decoded template in aw's namespace, labelled
// with the AppWrapper (an existing value is kept), and in each pod set
// fixed in status.componentStatus[idx] (the effective pod sets when that
// is not recorded yet) the pod template gets Kueue's podSetInfos[i], the
// AppWrapper label, the configured scheduler name, the Autopilot and
// quarantine anti-affinities, and FTL_WORKLOAD / FTL_WORKLOAD_RESETS in
// every container. The owner reference is the caller's to set.
func BuildComponent(aw *v1beta2.AppWrapper, idx int, opts InjectOptions) (*unstructured.Unstructured, error) {
	if idx < 0 || idx >= len(aw.Spec.Components) {
		return nil, fmt.Errorf("appwrapper %s/%s: component %d of %d", aw.Namespace, aw.Name, idx, len(aw.Spec.Components))
	}
	comp := aw.Spec.Components[idx]
	obj, err := DecodeTemplate(comp.Template)
	if err != nil {
		return nil, &FatalError{Err: fmt.Errorf("component %d: %w", idx, err)}
	}
	obj.SetNamespace(aw.Namespace)
	labels := obj.GetLabels()
	if _, ok := labels[v1beta2.AppWrapperLabel]; !ok {
		if labels == nil {
			labels = map[string]string{}
		}
		labels[v1beta2.AppWrapperLabel] = aw.Name
		obj.SetLabels(labels)
	}

	var podSets []v1beta2.AppWrapperPodSet
	if idx < len(aw.Status.ComponentStatus) {
		podSets = aw.Status.ComponentStatus[idx].PodSets
	} else if podSets, err = EffectivePodSets(comp); err != nil {
		return nil, &FatalError{Err: fmt.Errorf("component %d: %w", idx, err)}
	}

	// The ft-launcher in the pod derives its run id from these (package
	// k8s), so each reset, a new incarnation, starts a new run.
	env := []corev1.EnvVar{
		{Name: k8s.EnvWorkload, Value: aw.Namespace + "/" + aw.Name},
		{Name: k8s.EnvWorkloadResets, Value: strconv.Itoa(int(aw.Status.Retries))},
	}
	avoid := avoidNodesRequirement(opts.AvoidNodes)
	for i, ps := range podSets {
		var info *v1beta2.AppWrapperPodSetInfo
		if i < len(comp.PodSetInfos) {
			info = &comp.PodSetInfos[i]
		}
		if err := injectPodSet(obj.Object, ps.Path, info, aw.Name, env, avoid, opts); err != nil {
			return nil, fmt.Errorf("component %d (%s %q) pod set %d: %w", idx, obj.GetKind(), obj.GetName(), i, err)
		}
	}
	return obj, nil
}

// avoidNodesRequirement is the NotIn on host names, nil for none.
func avoidNodesRequirement(hosts []string) *corev1.NodeSelectorRequirement {
	var vals []string
	for _, h := range hosts {
		if h != "" && !slices.Contains(vals, h) {
			vals = append(vals, h)
		}
	}
	if len(vals) == 0 {
		return nil
	}
	sort.Strings(vals)
	return &corev1.NodeSelectorRequirement{Key: hostnameLabel, Operator: corev1.NodeSelectorOpNotIn, Values: vals}
}

// injectPodSet edits the pod template at path in place. It reads the
// template through the typed API but writes only the fields it sets, so
// fields this build does not know survive.
func injectPodSet(obj map[string]any, path string, info *v1beta2.AppWrapperPodSetInfo, awName string,
	env []corev1.EnvVar, avoid *corev1.NodeSelectorRequirement, opts InjectOptions) error {
	tmpl, err := podTemplateMap(obj, path)
	if err != nil {
		return &FatalError{Err: err}
	}
	typed, err := GetPodTemplate(obj, path)
	if err != nil {
		return &FatalError{Err: err}
	}
	meta, err := childMap(tmpl, "metadata", path)
	if err != nil {
		return err
	}
	spec, err := childMap(tmpl, "spec", path)
	if err != nil {
		return err
	}

	if info != nil {
		if err := mergeStrings(meta, "labels", info.Labels, path+".metadata"); err != nil {
			return err
		}
		if err := mergeStrings(meta, "annotations", info.Annotations, path+".metadata"); err != nil {
			return err
		}
		if err := mergeStrings(spec, "nodeSelector", info.NodeSelector, path+".spec"); err != nil {
			return err
		}
		if err := appendTolerations(spec, info.Tolerations, path); err != nil {
			return err
		}
		if err := appendSchedulingGates(spec, info.SchedulingGates, path); err != nil {
			return err
		}
	}
	if err := mergeStrings(meta, "labels", map[string]string{v1beta2.AppWrapperLabel: awName}, path+".metadata"); err != nil {
		return err
	}
	if opts.SchedulerName != "" {
		if s, _ := spec["schedulerName"].(string); s == "" {
			spec["schedulerName"] = opts.SchedulerName
		}
	}

	required, preferred := autopilotAffinity(&typed.Spec, opts.Autopilot)
	if avoid != nil {
		required = append(required, *avoid)
	}
	if len(required) > 0 || preferred != nil {
		aff := typed.Spec.Affinity
		if aff == nil {
			aff = &corev1.Affinity{}
		}
		addNodeAffinity(aff, required, preferred)
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(aff)
		if err != nil {
			return fmt.Errorf("%s.spec.affinity: %w", path, err)
		}
		spec["affinity"] = u
	}

	for _, field := range []string{"containers", "initContainers"} {
		if err := setEnv(spec, field, env, path); err != nil {
			return err
		}
	}
	return nil
}

// addNodeAffinity appends required to every required node selector term
// (terms are ORed, so each must exclude the nodes; upstream's resource_management.go),
// creating one term when there is none, and adds the preferred term.
func addNodeAffinity(aff *corev1.Affinity, required []corev1.NodeSelectorRequirement, preferred *corev1.PreferredSchedulingTerm) {
	if aff.NodeAffinity == nil {
		aff.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := aff.NodeAffinity
	if len(required) > 0 {
		if na.RequiredDuringSchedulingIgnoredDuringExecution == nil {
			na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{}
		}
		ns := na.RequiredDuringSchedulingIgnoredDuringExecution
		if len(ns.NodeSelectorTerms) == 0 {
			ns.NodeSelectorTerms = []corev1.NodeSelectorTerm{{}}
		}
		for i := range ns.NodeSelectorTerms {
			for _, r := range required {
				r.Values = slices.Clone(r.Values)
				ns.NodeSelectorTerms[i].MatchExpressions = append(ns.NodeSelectorTerms[i].MatchExpressions, r)
			}
		}
	}
	if preferred != nil {
		na.PreferredDuringSchedulingIgnoredDuringExecution = append(na.PreferredDuringSchedulingIgnoredDuringExecution, *preferred)
	}
}

// childMap returns parent[field] as a mapping, creating it when absent.
func childMap(parent map[string]any, field, path string) (map[string]any, error) {
	v, ok := parent[field]
	if !ok || v == nil {
		m := map[string]any{}
		parent[field] = m
		return m, nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fatalf("%s.%s is not an object", path, field)
	}
	return m, nil
}

// mergeStrings adds add to the string map parent[field]. A key already
// there with another value is a FatalError (upstream's resource_management.go): silently
// overriding would break either the user's template or Kueue's placement.
func mergeStrings(parent map[string]any, field string, add map[string]string, path string) error {
	if len(add) == 0 {
		return nil
	}
	m, err := childMap(parent, field, path)
	if err != nil {
		return err
	}
	keys := make([]string, 0, len(add))
	for k := range add {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if old, ok := m[k]; ok {
			if s, isString := old.(string); !isString || s != add[k] {
				return fatalf("%s.%s: key %q is %v, cannot set it to %q", path, field, k, old, add[k])
			}
			continue
		}
		m[k] = add[k]
	}
	return nil
}

// listAt returns parent[field] (at where) as a list, nil when absent.
func listAt(parent map[string]any, field, where string) ([]any, error) {
	v, ok := parent[field]
	if !ok || v == nil {
		return nil, nil
	}
	l, ok := v.([]any)
	if !ok {
		return nil, fatalf("%s.%s is not a list", where, field)
	}
	return l, nil
}

func appendTolerations(spec map[string]any, tols []corev1.Toleration, path string) error {
	if len(tols) == 0 {
		return nil
	}
	l, err := listAt(spec, "tolerations", path+".spec")
	if err != nil {
		return err
	}
	for i := range tols {
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&tols[i])
		if err != nil {
			return fmt.Errorf("%s.spec.tolerations: %w", path, err)
		}
		l = append(l, u)
	}
	spec["tolerations"] = l
	return nil
}

// appendSchedulingGates adds the gates not already named (gates are keyed
// by name; a duplicate would be rejected by the API server).
func appendSchedulingGates(spec map[string]any, gates []corev1.PodSchedulingGate, path string) error {
	if len(gates) == 0 {
		return nil
	}
	l, err := listAt(spec, "schedulingGates", path+".spec")
	if err != nil {
		return err
	}
	var names []string
	for _, g := range l {
		if m, ok := g.(map[string]any); ok {
			if n, ok := m["name"].(string); ok {
				names = append(names, n)
			}
		}
	}
	for _, g := range gates {
		if slices.Contains(names, g.Name) {
			continue
		}
		names = append(names, g.Name)
		l = append(l, map[string]any{"name": g.Name})
	}
	spec["schedulingGates"] = l
	return nil
}

// setEnv sets each variable of env in every container of spec[field],
// replacing a variable of the same name (value or valueFrom) in place.
func setEnv(spec map[string]any, field string, env []corev1.EnvVar, path string) error {
	containers, err := listAt(spec, field, path+".spec")
	if err != nil {
		return err
	}
	for ci, c := range containers {
		cm, ok := c.(map[string]any)
		if !ok {
			return fatalf("%s.spec.%s[%d] is not an object", path, field, ci)
		}
		vars, err := listAt(cm, "env", fmt.Sprintf("%s.spec.%s[%d]", path, field, ci))
		if err != nil {
			return err
		}
		for _, e := range env {
			entry := map[string]any{"name": e.Name, "value": e.Value}
			replaced := false
			for vi, v := range vars {
				if vm, ok := v.(map[string]any); ok && vm["name"] == e.Name {
					vars[vi] = entry
					replaced = true
				}
			}
			if !replaced {
				vars = append(vars, entry)
			}
		}
		cm["env"] = vars
	}
	return nil
}
