package appwrapper

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
)

// newAW wraps the component templates (YAML) in an AppWrapper whose
// componentStatus holds their effective pod sets, as the reconciler leaves
// it before creating anything.
func newAW(t *testing.T, templates ...string) *v1beta2.AppWrapper {
	t.Helper()
	aw := &v1beta2.AppWrapper{}
	aw.Name, aw.Namespace = "train", "team1"
	for _, y := range templates {
		comp := component(t, y)
		sets, err := EffectivePodSets(comp)
		if err != nil {
			t.Fatal(err)
		}
		aw.Spec.Components = append(aw.Spec.Components, comp)
		aw.Status.ComponentStatus = append(aw.Status.ComponentStatus, v1beta2.AppWrapperComponentStatus{PodSets: sets})
	}
	return aw
}

func podTemplate(t *testing.T, obj *unstructured.Unstructured, path string) *corev1.PodTemplateSpec {
	t.Helper()
	pt, err := GetPodTemplate(obj.Object, path)
	if err != nil {
		t.Fatal(err)
	}
	return pt
}

func envOf(c corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		m[e.Name] = e.Value
	}
	return m
}

func notIn(key string, values ...string) corev1.NodeSelectorRequirement {
	return corev1.NodeSelectorRequirement{Key: key, Operator: corev1.NodeSelectorOpNotIn, Values: values}
}

const gpuJob = `
apiVersion: batch/v1
kind: Job
metadata:
  name: trainer
  labels: {team: a}
spec:
  parallelism: 2
  template:
    spec:
      futureField: kept
      initContainers:
      - name: init
        image: i
      containers:
      - name: launcher
        image: l
        env:
        - name: FTL_WORKLOAD
          valueFrom: {fieldRef: {fieldPath: metadata.name}}
        - name: OTHER
          value: x
        resources:
          limits: {nvidia.com/gpu: 8}
      - name: sidecar
        image: s
`

const cpuPod = `
apiVersion: v1
kind: Pod
metadata:
  name: helper
spec:
  schedulerName: custom
  containers:
  - name: c
    image: i
    resources:
      requests: {cpu: "1", nvidia.com/gpu: "0"}
`

func TestBuildComponentBasics(t *testing.T) {
	aw := newAW(t, gpuJob, cpuPod)
	aw.Status.Retries = 2
	opts := InjectOptions{SchedulerName: "coscheduler", Autopilot: DefaultConfig().Autopilot}

	obj, err := BuildComponent(aw, 0, opts)
	if err != nil {
		t.Fatal(err)
	}
	if obj.GetNamespace() != "team1" || obj.GetLabels()[v1beta2.AppWrapperLabel] != "train" || obj.GetLabels()["team"] != "a" {
		t.Errorf("metadata: %v %v", obj.GetNamespace(), obj.GetLabels())
	}
	if len(obj.GetOwnerReferences()) != 0 {
		t.Error("owner reference set")
	}
	pt := podTemplate(t, obj, "template.spec.template")
	if pt.Labels[v1beta2.AppWrapperLabel] != "train" || pt.Spec.SchedulerName != "coscheduler" {
		t.Errorf("pod template: %+v", pt.ObjectMeta)
	}
	for _, c := range append(pt.Spec.InitContainers, pt.Spec.Containers...) {
		env := envOf(c)
		if env["FTL_WORKLOAD"] != "team1/train" || env["FTL_WORKLOAD_RESETS"] != "2" {
			t.Errorf("container %s env %v", c.Name, c.Env)
		}
	}
	// The existing FTL_WORKLOAD is replaced in place, valueFrom dropped.
	launcher := pt.Spec.Containers[0]
	if len(launcher.Env) != 3 || launcher.Env[0].Name != "FTL_WORKLOAD" || launcher.Env[0].ValueFrom != nil || launcher.Env[1].Name != "OTHER" {
		t.Errorf("launcher env %+v", launcher.Env)
	}
	// Fields this build does not know survive.
	if v, _, _ := unstructured.NestedString(obj.Object, "spec", "template", "spec", "futureField"); v != "kept" {
		t.Errorf("futureField lost: %q", v)
	}
	// The GPU template gets the default Autopilot affinities.
	na := pt.Spec.Affinity.NodeAffinity
	wantReq := []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{notIn("autopilot.ibm.com/gpuhealth", "TESTING", "EVICT")}}}
	if !reflect.DeepEqual(na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms, wantReq) {
		t.Errorf("required %+v", na.RequiredDuringSchedulingIgnoredDuringExecution)
	}
	wantPref := []corev1.PreferredSchedulingTerm{{Weight: 50, Preference: corev1.NodeSelectorTerm{
		MatchExpressions: []corev1.NodeSelectorRequirement{notIn("autopilot.ibm.com/gpuhealth", "WARN")}}}}
	if !reflect.DeepEqual(na.PreferredDuringSchedulingIgnoredDuringExecution, wantPref) {
		t.Errorf("preferred %+v", na.PreferredDuringSchedulingIgnoredDuringExecution)
	}

	// A Pod: its own metadata is the template; a zero GPU request is none;
	// a scheduler name already set stays.
	obj, err = BuildComponent(aw, 1, opts)
	if err != nil {
		t.Fatal(err)
	}
	pt = podTemplate(t, obj, "template")
	if pt.Labels[v1beta2.AppWrapperLabel] != "train" || pt.Spec.SchedulerName != "custom" || pt.Spec.Affinity != nil {
		t.Errorf("pod: %+v", pt)
	}
	if obj.GetKind() != "Pod" || obj.GetAPIVersion() != "v1" || obj.GetNamespace() != "team1" {
		t.Errorf("pod object: %v", obj.Object)
	}
}

func TestBuildComponentAffinity(t *testing.T) {
	const multiTerm = `
apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchExpressions: [{key: zone, operator: In, values: [a]}]
        - matchFields: [{key: metadata.name, operator: In, values: [n1]}]
      preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 7
        preference:
          matchExpressions: [{key: fast, operator: Exists}]
  initContainers:
  - name: init
    image: i
    resources:
      requests: {example.com/fpga: 1}
  containers:
  - name: c
    image: i
`
	weight := int32(20)
	ap := AutopilotConfig{
		InjectAntiAffinities: true,
		ResourceTaints: map[string][]corev1.Taint{
			"example.com/fpga": {
				{Key: "fpga", Value: "BAD", Effect: corev1.TaintEffectNoExecute},
				{Key: "fpga", Value: "SLOW", Effect: corev1.TaintEffectPreferNoSchedule},
			},
			"nvidia.com/gpu": {{Key: "gpu", Value: "BAD", Effect: corev1.TaintEffectNoExecute}},
		},
		PreferNoScheduleWeight: &weight,
	}
	hostNotIn := notIn("kubernetes.io/hostname", "node-a", "node-b")

	for _, tc := range []struct {
		name     string
		ap       AutopilotConfig
		avoid    []string
		template string
		required []corev1.NodeSelectorTerm // nil: no required selector
		pref     []corev1.PreferredSchedulingTerm
	}{
		{name: "every term gets the NotIn; init container request counts", ap: ap, template: multiTerm,
			required: []corev1.NodeSelectorTerm{
				{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}, notIn("fpga", "BAD")}},
				{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n1"}}},
					MatchExpressions: []corev1.NodeSelectorRequirement{notIn("fpga", "BAD")}},
			},
			pref: []corev1.PreferredSchedulingTerm{
				{Weight: 7, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "fast", Operator: corev1.NodeSelectorOpExists}}}},
				{Weight: 20, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{notIn("fpga", "SLOW")}}},
			}},
		{name: "avoid nodes with autopilot, every term", ap: ap, avoid: []string{"node-b", "node-a", "node-b", ""}, template: multiTerm,
			required: []corev1.NodeSelectorTerm{
				{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}, notIn("fpga", "BAD"), hostNotIn}},
				{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n1"}}},
					MatchExpressions: []corev1.NodeSelectorRequirement{notIn("fpga", "BAD"), hostNotIn}},
			},
			pref: []corev1.PreferredSchedulingTerm{
				{Weight: 7, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "fast", Operator: corev1.NodeSelectorOpExists}}}},
				{Weight: 20, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{notIn("fpga", "SLOW")}}},
			}},
		{name: "avoid nodes for a pod requesting nothing; a term is created", ap: ap, avoid: []string{"node-a", "node-b"}, template: cpuPod,
			required: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{hostNotIn}}}},
		{name: "injection off: nothing for the resources", ap: AutopilotConfig{ResourceTaints: ap.ResourceTaints}, template: gpuJob},
		{name: "no resource requested: nothing", ap: ap, template: cpuPod},
		{name: "unset weight is 1; resources merged by key", template: gpuJob, ap: AutopilotConfig{
			InjectAntiAffinities: true,
			ResourceTaints: map[string][]corev1.Taint{
				"nvidia.com/gpu": {
					{Key: "h", Value: "B", Effect: corev1.TaintEffectNoSchedule},
					{Key: "h", Value: "C", Effect: corev1.TaintEffectNoExecute},
					{Key: "h", Value: "W", Effect: corev1.TaintEffectPreferNoSchedule},
				},
				"a.example/gpu": {{Key: "h", Value: "A", Effect: corev1.TaintEffectNoExecute}},
				"z.example/nic": {{Key: "h", Value: "B", Effect: corev1.TaintEffectNoExecute}},
			},
		},
			required: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{notIn("h", "B", "C")}}},
			pref:     []corev1.PreferredSchedulingTerm{{Weight: 1, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{notIn("h", "W")}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			aw := newAW(t, tc.template)
			obj, err := BuildComponent(aw, 0, InjectOptions{Autopilot: tc.ap, AvoidNodes: tc.avoid})
			if err != nil {
				t.Fatal(err)
			}
			path := aw.Status.ComponentStatus[0].PodSets[0].Path
			pt := podTemplate(t, obj, path)
			var na corev1.NodeAffinity
			if pt.Spec.Affinity != nil && pt.Spec.Affinity.NodeAffinity != nil {
				na = *pt.Spec.Affinity.NodeAffinity
			}
			var gotReq []corev1.NodeSelectorTerm
			if na.RequiredDuringSchedulingIgnoredDuringExecution != nil {
				gotReq = na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
			}
			if !reflect.DeepEqual(gotReq, tc.required) {
				t.Errorf("required\n got %+v\nwant %+v", gotReq, tc.required)
			}
			if !reflect.DeepEqual(na.PreferredDuringSchedulingIgnoredDuringExecution, tc.pref) {
				t.Errorf("preferred\n got %+v\nwant %+v", na.PreferredDuringSchedulingIgnoredDuringExecution, tc.pref)
			}
		})
	}
}

func TestBuildComponentPodSetInfos(t *testing.T) {
	const jobset = `
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: js
  labels:
    workload.codeflare.dev/appwrapper: someone-else
spec:
  replicatedJobs:
  - name: a
    template:
      spec:
        template:
          metadata:
            labels: {role: a}
            annotations: {note: "1"}
          spec:
            nodeSelector: {pool: gpu}
            tolerations: [{key: old, operator: Exists}]
            schedulingGates: [{name: kueue}]
            containers: [{name: c, image: i}]
  - name: b
    template:
      spec:
        template:
          spec:
            containers: [{name: c, image: i}]
`
	aw := newAW(t, jobset)
	aw.Spec.Components[0].PodSetInfos = []v1beta2.AppWrapperPodSetInfo{
		{
			Labels:          map[string]string{"role": "a", "kueue": "yes"},
			Annotations:     map[string]string{"admitted": "true"},
			NodeSelector:    map[string]string{"pool": "gpu", "zone": "z1"},
			Tolerations:     []corev1.Toleration{{Key: "new", Operator: corev1.TolerationOpEqual, Value: "v", Effect: corev1.TaintEffectNoSchedule}},
			SchedulingGates: []corev1.PodSchedulingGate{{Name: "kueue"}, {Name: "topology"}},
		},
		{Labels: map[string]string{"second": "b"}},
	}
	obj, err := BuildComponent(aw, 0, InjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Keep-first on the object itself.
	if got := obj.GetLabels()[v1beta2.AppWrapperLabel]; got != "someone-else" {
		t.Errorf("object label %q", got)
	}
	a := podTemplate(t, obj, "template.spec.replicatedJobs[0].template.spec.template")
	wantLabels := map[string]string{"role": "a", "kueue": "yes", v1beta2.AppWrapperLabel: "train"}
	if !reflect.DeepEqual(a.Labels, wantLabels) || a.Annotations["note"] != "1" || a.Annotations["admitted"] != "true" {
		t.Errorf("metadata %+v", a.ObjectMeta)
	}
	if !reflect.DeepEqual(a.Spec.NodeSelector, map[string]string{"pool": "gpu", "zone": "z1"}) {
		t.Errorf("nodeSelector %v", a.Spec.NodeSelector)
	}
	if len(a.Spec.Tolerations) != 2 || a.Spec.Tolerations[0].Key != "old" || a.Spec.Tolerations[1].Key != "new" ||
		a.Spec.Tolerations[1].Effect != corev1.TaintEffectNoSchedule {
		t.Errorf("tolerations %+v", a.Spec.Tolerations)
	}
	if !reflect.DeepEqual(a.Spec.SchedulingGates, []corev1.PodSchedulingGate{{Name: "kueue"}, {Name: "topology"}}) {
		t.Errorf("gates %+v", a.Spec.SchedulingGates)
	}
	b := podTemplate(t, obj, "template.spec.replicatedJobs[1].template.spec.template")
	if !reflect.DeepEqual(b.Labels, map[string]string{"second": "b", v1beta2.AppWrapperLabel: "train"}) || len(b.Spec.Tolerations) != 0 {
		t.Errorf("second pod set %+v", b)
	}
}

func TestBuildComponentErrors(t *testing.T) {
	info := func(i v1beta2.AppWrapperPodSetInfo) func(aw *v1beta2.AppWrapper) {
		return func(aw *v1beta2.AppWrapper) { aw.Spec.Components[0].PodSetInfos = []v1beta2.AppWrapperPodSetInfo{i} }
	}
	const labelled = `
apiVersion: batch/v1
kind: Job
metadata: {name: j}
spec:
  template:
    metadata:
      labels: {role: worker, workload.codeflare.dev/appwrapper: other}
      annotations: {a: "1"}
    spec:
      nodeSelector: {pool: cpu}
      containers: [{name: c, image: i}]
`
	const plain = `
apiVersion: batch/v1
kind: Job
metadata: {name: j}
spec:
  template:
    metadata:
      labels: {role: worker}
      annotations: {a: "1"}
    spec:
      nodeSelector: {pool: cpu}
      containers: [{name: c, image: i}]
`
	for _, tc := range []struct {
		name     string
		template string
		edit     func(aw *v1beta2.AppWrapper)
		idx      int
		fatal    bool
		want     string
	}{
		{name: "label conflict", template: plain, edit: info(v1beta2.AppWrapperPodSetInfo{Labels: map[string]string{"role": "launcher"}}),
			fatal: true, want: `template.spec.template.metadata.labels: key "role" is worker, cannot set it to "launcher"`},
		{name: "annotation conflict", template: plain, edit: info(v1beta2.AppWrapperPodSetInfo{Annotations: map[string]string{"a": "2"}}),
			fatal: true, want: `annotations: key "a"`},
		{name: "nodeSelector conflict", template: plain, edit: info(v1beta2.AppWrapperPodSetInfo{NodeSelector: map[string]string{"pool": "gpu"}}),
			fatal: true, want: `template.spec.template.spec.nodeSelector: key "pool"`},
		{name: "appwrapper label conflict in the pod template", template: labelled,
			fatal: true, want: `key "workload.codeflare.dev/appwrapper" is other, cannot set it to "train"`},
		{name: "template does not decode", template: plain, edit: func(aw *v1beta2.AppWrapper) {
			aw.Spec.Components[0].Template.Raw = []byte(`{"kind": 3}`)
		}, fatal: true, want: "component 0: decode component template"},
		{name: "path leads nowhere", template: plain, edit: func(aw *v1beta2.AppWrapper) {
			aw.Status.ComponentStatus[0].PodSets = []v1beta2.AppWrapperPodSet{ps("template.spec.nothing", 1)}
		}, fatal: true, want: "template.spec.nothing not found"},
		{name: "no component status: effective pod sets, which fail", template: plain, edit: func(aw *v1beta2.AppWrapper) {
			aw.Status.ComponentStatus = nil
			aw.Spec.Components[0].DeclaredPodSets = []v1beta2.AppWrapperPodSet{ps("template.spec.template", 5)}
		}, fatal: true, want: "declared 5 replicas"},
		{name: "containers not a list", template: "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: {c: 1}",
			fatal: true, want: "pod template at template: cannot restore slice"},
		{name: "index out of range is not fatal", template: plain, idx: 1, want: "component 1 of 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			aw := newAW(t, tc.template)
			if tc.edit != nil {
				tc.edit(aw)
			}
			_, err := BuildComponent(aw, tc.idx, InjectOptions{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			var fe *FatalError
			if errors.As(err, &fe) != tc.fatal || IsFatal(err) != tc.fatal {
				t.Errorf("fatal = %v, want %v (%v)", errors.As(err, &fe), tc.fatal, err)
			}
		})
	}
}

func TestBuildComponentNoComponentStatus(t *testing.T) {
	aw := newAW(t, gpuJob)
	aw.Status.ComponentStatus = nil
	obj, err := BuildComponent(aw, 0, InjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pt := podTemplate(t, obj, "template.spec.template"); pt.Labels[v1beta2.AppWrapperLabel] != "train" {
		t.Errorf("labels %v", pt.Labels)
	}
}

func TestBuildComponentDoesNotChangeAppWrapper(t *testing.T) {
	aw := newAW(t, gpuJob)
	raw := string(aw.Spec.Components[0].Template.Raw)
	if _, err := BuildComponent(aw, 0, InjectOptions{AvoidNodes: []string{"n"}, Autopilot: DefaultConfig().Autopilot}); err != nil {
		t.Fatal(err)
	}
	if string(aw.Spec.Components[0].Template.Raw) != raw {
		t.Error("template changed")
	}
}
