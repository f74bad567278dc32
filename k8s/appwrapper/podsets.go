package appwrapper

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
)

// The kinds whose pod sets are inferred (upstream's pkg/utils/utils.go), as
// schema.GroupVersionKind.String() spells them.
const (
	gvkPod         = "/v1, Kind=Pod"
	gvkDeployment  = "apps/v1, Kind=Deployment"
	gvkStatefulSet = "apps/v1, Kind=StatefulSet"
	gvkJob         = "batch/v1, Kind=Job"
	gvkJobSet      = "jobset.x-k8s.io/v1alpha2, Kind=JobSet"
	gvkPyTorchJob  = "kubeflow.org/v1, Kind=PyTorchJob"
	gvkRayCluster  = "ray.io/v1, Kind=RayCluster"
	gvkRayJob      = "ray.io/v1, Kind=RayJob"
)

// rootField is the first element of every pod-set path: the component's
// template itself.
const rootField = "template"

// InferPodSets returns the pod sets of a known kind (upstream's pkg/utils/utils.go):
// Pod, Deployment, StatefulSet, batch Job, JobSet v1alpha2, PyTorchJob,
// RayCluster and RayJob. Any other kind (a PodGroup, a ConfigMap) creates
// no pods it could label, so it has none.
func InferPodSets(obj *unstructured.Unstructured) ([]v1beta2.AppWrapperPodSet, error) {
	sets, _, err := inferPodSets(obj)
	return sets, err
}

// inferPodSets also says whether the kind is one it knows.
func inferPodSets(obj *unstructured.Unstructured) ([]v1beta2.AppWrapperPodSet, bool, error) {
	gvk := obj.GroupVersionKind()
	u := obj.Object
	var sets []v1beta2.AppWrapperPodSet
	add := func(path string, replicas int64) error {
		if replicas < 0 || replicas > math.MaxInt32 {
			return fmt.Errorf("%s: %s has %d replicas", gvk.Kind, path, replicas)
		}
		r := int32(replicas)
		sets = append(sets, v1beta2.AppWrapperPodSet{Path: path, Replicas: &r})
		return nil
	}
	var err error
	switch gvk.String() {
	case gvkPod:
		err = add(rootField, 1)
	case gvkDeployment, gvkStatefulSet:
		var n int64
		if n, err = intField(u, 1, "spec", "replicas"); err == nil {
			err = add("template.spec.template", n)
		}
	case gvkJob:
		var n int64
		if n, err = jobPods(u, "spec"); err == nil {
			err = add("template.spec.template", n)
		}
	case gvkJobSet:
		var jobs []any
		if jobs, err = listField(u, "spec", "replicatedJobs"); err != nil {
			break
		}
		for i, j := range jobs {
			rj, ok := j.(map[string]any)
			if !ok {
				err = fmt.Errorf("JobSet: spec.replicatedJobs[%d] is not an object", i)
				break
			}
			var n, per int64
			if n, err = intField(rj, 1, "replicas"); err != nil {
				err = fmt.Errorf("JobSet: spec.replicatedJobs[%d]: %w", i, err)
				break
			}
			if per, err = jobPods(rj, "template", "spec"); err != nil {
				err = fmt.Errorf("JobSet: spec.replicatedJobs[%d]: %w", i, err)
				break
			}
			if err = add(fmt.Sprintf("template.spec.replicatedJobs[%d].template.spec.template", i), n*per); err != nil {
				break
			}
		}
	case gvkPyTorchJob:
		for _, role := range []string{"Master", "Worker"} {
			spec, found, ferr := unstructured.NestedFieldNoCopy(u, "spec", "pytorchReplicaSpecs", role)
			if ferr != nil || !found || spec == nil {
				continue
			}
			m, ok := spec.(map[string]any)
			if !ok {
				err = fmt.Errorf("PyTorchJob: spec.pytorchReplicaSpecs.%s is not an object", role)
				break
			}
			var n int64
			if n, err = intField(m, 1, "replicas"); err != nil {
				err = fmt.Errorf("PyTorchJob: spec.pytorchReplicaSpecs.%s: %w", role, err)
				break
			}
			if err = add("template.spec.pytorchReplicaSpecs."+role+".template", n); err != nil {
				break
			}
		}
	case gvkRayCluster:
		sets, err = rayPodSets(u, []string{"spec"}, "template.spec")
	case gvkRayJob:
		sets, err = rayPodSets(u, []string{"spec", "rayClusterSpec"}, "template.spec.rayClusterSpec")
	default:
		return nil, false, nil
	}
	if err != nil {
		return nil, true, fmt.Errorf("infer pod sets of %s %q: %w", gvk.Kind, obj.GetName(), err)
	}
	return sets, true, nil
}

// jobPods is a Job spec's pod count: min(parallelism, completions), with
// parallelism defaulting to 1 and unset completions not limiting it.
func jobPods(u map[string]any, specPath ...string) (int64, error) {
	spec, _, _ := unstructured.NestedFieldNoCopy(u, specPath...)
	m, _ := spec.(map[string]any)
	p, err := intField(m, 1, "parallelism")
	if err != nil {
		return 0, err
	}
	c, err := intField(m, -1, "completions")
	if err != nil {
		return 0, err
	}
	if c >= 0 && c < p {
		p = c
	}
	return p, nil
}

// rayPodSets is the head (one pod) plus each worker group, whose pods are
// replicas x numOfHosts (multi-host groups run numOfHosts pods per replica).
func rayPodSets(u map[string]any, cluster []string, prefix string) ([]v1beta2.AppWrapperPodSet, error) {
	one := int32(1)
	sets := []v1beta2.AppWrapperPodSet{{Path: prefix + ".headGroupSpec.template", Replicas: &one}}
	groups, err := listField(u, append(cluster, "workerGroupSpecs")...)
	if err != nil {
		return nil, err
	}
	for i, g := range groups {
		m, ok := g.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("workerGroupSpecs[%d] is not an object", i)
		}
		n, err := intField(m, 1, "replicas")
		if err != nil {
			return nil, fmt.Errorf("workerGroupSpecs[%d]: %w", i, err)
		}
		hosts, err := intField(m, 1, "numOfHosts")
		if err != nil {
			return nil, fmt.Errorf("workerGroupSpecs[%d]: %w", i, err)
		}
		total := n * max(hosts, 1)
		if total < 0 || total > math.MaxInt32 {
			return nil, fmt.Errorf("workerGroupSpecs[%d]: %d pods", i, total)
		}
		r := int32(total)
		sets = append(sets, v1beta2.AppWrapperPodSet{Path: fmt.Sprintf("%s.workerGroupSpecs[%d].template", prefix, i), Replicas: &r})
	}
	return sets, nil
}

// intField reads an integer at fields of u, def when absent or null.
func intField(u map[string]any, def int64, fields ...string) (int64, error) {
	if u == nil {
		return def, nil
	}
	v, found, err := unstructured.NestedFieldNoCopy(u, fields...)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", strings.Join(fields, "."), err)
	}
	if !found || v == nil {
		return def, nil
	}
	n, ok := asInt(v)
	if !ok {
		return 0, fmt.Errorf("%s: %v is not an integer", strings.Join(fields, "."), v)
	}
	return n, nil
}

// asInt accepts the integer forms an unstructured object may hold.
func asInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int64:
		return n, true
	case int32:
		return int64(n), true
	case int:
		return int64(n), true
	case float64:
		if n == math.Trunc(n) && math.Abs(n) <= math.MaxInt64 {
			return int64(n), true
		}
	case json.Number:
		i, err := n.Int64()
		return i, err == nil
	}
	return 0, false
}

// listField reads a list at fields of u; absent means empty.
func listField(u map[string]any, fields ...string) ([]any, error) {
	v, found, err := unstructured.NestedFieldNoCopy(u, fields...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", strings.Join(fields, "."), err)
	}
	if !found || v == nil {
		return nil, nil
	}
	l, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%s is not a list", strings.Join(fields, "."))
	}
	return l, nil
}

// DecodeTemplate decodes a component's template into an object, which must
// name its apiVersion and kind.
func DecodeTemplate(raw runtime.RawExtension) (*unstructured.Unstructured, error) {
	obj := &unstructured.Unstructured{}
	switch {
	case len(raw.Raw) > 0:
		if err := obj.UnmarshalJSON(raw.Raw); err != nil {
			return nil, fmt.Errorf("decode component template: %w", err)
		}
	case raw.Object != nil:
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(raw.Object)
		if err != nil {
			return nil, fmt.Errorf("decode component template: %w", err)
		}
		obj.Object = m
		if obj.GetKind() == "" {
			obj.SetGroupVersionKind(raw.Object.GetObjectKind().GroupVersionKind())
		}
	default:
		return nil, errors.New("decode component template: empty template")
	}
	if obj.GetKind() == "" || obj.GetAPIVersion() == "" {
		return nil, errors.New("decode component template: apiVersion and kind are required")
	}
	return obj, nil
}

// EffectivePodSets returns the component's declared pod sets, or the
// inferred ones when it declares none (upstream's pkg/utils/utils.go). Declared sets of
// a known kind must match the inferred ones; every declared path must lead
// to a pod template, whatever the kind.
func EffectivePodSets(comp v1beta2.AppWrapperComponent) ([]v1beta2.AppWrapperPodSet, error) {
	obj, err := DecodeTemplate(comp.Template)
	if err != nil {
		return nil, err
	}
	inferred, known, err := inferPodSets(obj)
	if err != nil {
		return nil, err
	}
	if len(comp.DeclaredPodSets) == 0 {
		return inferred, nil
	}
	for i, ps := range comp.DeclaredPodSets {
		if _, err := GetPodTemplate(obj.Object, ps.Path); err != nil {
			return nil, fmt.Errorf("%s %q: podSets[%d]: %w", obj.GetKind(), obj.GetName(), i, err)
		}
	}
	if known {
		if err := ValidatePodSets(comp.DeclaredPodSets, inferred); err != nil {
			return nil, fmt.Errorf("%s %q: %w", obj.GetKind(), obj.GetName(), err)
		}
	}
	return comp.DeclaredPodSets, nil
}

// ValidatePodSets checks declared pod sets against the inferred ones of a
// known kind: the same number, in the same order, with the same paths and
// replicas (nil meaning 1). Annotations may differ.
func ValidatePodSets(declared, inferred []v1beta2.AppWrapperPodSet) error {
	if len(declared) != len(inferred) {
		return fmt.Errorf("declared %d pod sets, the kind has %d (%s)", len(declared), len(inferred), describePodSets(inferred))
	}
	for i := range declared {
		d, f := declared[i], inferred[i]
		if d.Path != f.Path {
			return fmt.Errorf("podSets[%d]: declared path %q, the kind's is %q", i, d.Path, f.Path)
		}
		if replicas(d.Replicas) != replicas(f.Replicas) {
			return fmt.Errorf("podSets[%d] (%s): declared %d replicas, the object has %d", i, d.Path, replicas(d.Replicas), replicas(f.Replicas))
		}
	}
	return nil
}

func describePodSets(sets []v1beta2.AppWrapperPodSet) string {
	if len(sets) == 0 {
		return "none"
	}
	parts := make([]string, len(sets))
	for i, s := range sets {
		parts[i] = fmt.Sprintf("%s x%d", s.Path, replicas(s.Replicas))
	}
	return strings.Join(parts, ", ")
}

// replicas is a pod set's pod count; nil means 1.
func replicas(r *int32) int32 {
	if r == nil {
		return 1
	}
	return *r
}

// ExpectedPodCount is the number of pods the AppWrapper's pod sets create, from
// the pod sets fixed in status.componentStatus (upstream's
// appwrapper_controller.go, Running phase).
func ExpectedPodCount(aw *v1beta2.AppWrapper) int32 {
	var n int32
	for _, cs := range aw.Status.ComponentStatus {
		for _, ps := range cs.PodSets {
			n += replicas(ps.Replicas)
		}
	}
	return n
}

// GetPodTemplate decodes the pod template at path in a component template
// obj. The path is the restricted JSONPath of pod sets: it starts with
// "template" (obj itself) and goes on with ".field" and "[index]".
func GetPodTemplate(obj map[string]any, path string) (*corev1.PodTemplateSpec, error) {
	m, err := podTemplateMap(obj, path)
	if err != nil {
		return nil, err
	}
	pt := &corev1.PodTemplateSpec{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, pt); err != nil {
		return nil, fmt.Errorf("pod template at %s: %w", path, err)
	}
	return pt, nil
}

// podTemplateMap is the object at path, which must be a mapping.
func podTemplateMap(obj map[string]any, path string) (map[string]any, error) {
	v, err := valueAtPath(obj, path)
	if err != nil {
		return nil, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("path %s: not an object", path)
	}
	return m, nil
}

// valueAtPath walks path (see GetPodTemplate) through obj.
func valueAtPath(obj map[string]any, path string) (any, error) {
	rest, ok := strings.CutPrefix(path, rootField)
	if !ok {
		return nil, fmt.Errorf("path %q: must start with %q", path, rootField)
	}
	var cur any = obj
	walked := rootField
	for rest != "" {
		switch rest[0] {
		case '.':
			end := strings.IndexAny(rest[1:], ".[")
			if end < 0 {
				end = len(rest) - 1
			}
			field := rest[1 : 1+end]
			if field == "" {
				return nil, fmt.Errorf("path %q: empty field after %s", path, walked)
			}
			m, ok := cur.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("path %q: %s is not an object", path, walked)
			}
			next, found := m[field]
			walked += "." + field
			if !found {
				return nil, fmt.Errorf("path %q: %s not found", path, walked)
			}
			cur, rest = next, rest[1+end:]
		case '[':
			end := strings.IndexByte(rest, ']')
			if end < 0 {
				return nil, fmt.Errorf("path %q: unclosed [ after %s", path, walked)
			}
			i, err := strconv.Atoi(rest[1:end])
			if err != nil || i < 0 {
				return nil, fmt.Errorf("path %q: index %q after %s is not a non-negative integer", path, rest[1:end], walked)
			}
			l, ok := cur.([]any)
			if !ok {
				return nil, fmt.Errorf("path %q: %s is not a list", path, walked)
			}
			walked += rest[:end+1]
			if i >= len(l) {
				return nil, fmt.Errorf("path %q: %s out of range (%d elements)", path, walked, len(l))
			}
			cur, rest = l[i], rest[end+1:]
		default:
			return nil, fmt.Errorf("path %q: unexpected %q after %s", path, rest[0], walked)
		}
	}
	return cur, nil
}
