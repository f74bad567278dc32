package appwrapper

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	yamlutil "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
)

// The MLBatch quick start's samples (seed 002): a Job, and a Job with a
// coscheduler PodGroup.
// sample reads one of the MLBatch user guide's sample AppWrappers, kept
// verbatim in testdata.
func sample(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func decodeAW(t *testing.T, y string) *v1beta2.AppWrapper {
	t.Helper()
	js, err := yamlutil.ToJSON([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	aw := &v1beta2.AppWrapper{}
	if err := json.Unmarshal(js, aw); err != nil {
		t.Fatal(err)
	}
	return aw
}

func decodeObj(t *testing.T, y string) *unstructured.Unstructured {
	t.Helper()
	js, err := yamlutil.ToJSON([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	obj, err := DecodeTemplate(runtime.RawExtension{Raw: js})
	if err != nil {
		t.Fatal(err)
	}
	return obj
}

func ps(path string, replicas int32) v1beta2.AppWrapperPodSet {
	return v1beta2.AppWrapperPodSet{Path: path, Replicas: &replicas}
}

func TestSamplesPodSets(t *testing.T) {
	aw := decodeAW(t, sample(t, "job.yaml"))
	got, err := EffectivePodSets(aw.Spec.Components[0])
	if err != nil || !reflect.DeepEqual(got, []v1beta2.AppWrapperPodSet{ps("template.spec.template", 1)}) {
		t.Errorf("sample job: %+v, %v", got, err)
	}

	aw = decodeAW(t, sample(t, "job-with-podgroup.yaml"))
	got, err = EffectivePodSets(aw.Spec.Components[0])
	if err != nil || len(got) != 0 {
		t.Errorf("PodGroup: %+v, %v; want none", got, err)
	}
	got, err = EffectivePodSets(aw.Spec.Components[1])
	if err != nil || !reflect.DeepEqual(got, []v1beta2.AppWrapperPodSet{ps("template.spec.template", 2)}) {
		t.Errorf("Job with parallelism 2: %+v, %v", got, err)
	}
}

func TestInferPodSets(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []v1beta2.AppWrapperPodSet
		err        string
	}{
		{name: "pod", yaml: "apiVersion: v1\nkind: Pod\nspec: {}", want: []v1beta2.AppWrapperPodSet{ps("template", 1)}},
		{name: "deployment", yaml: "apiVersion: apps/v1\nkind: Deployment\nspec:\n  replicas: 3",
			want: []v1beta2.AppWrapperPodSet{ps("template.spec.template", 3)}},
		{name: "deployment default replicas", yaml: "apiVersion: apps/v1\nkind: Deployment\nspec: {}",
			want: []v1beta2.AppWrapperPodSet{ps("template.spec.template", 1)}},
		{name: "statefulset", yaml: "apiVersion: apps/v1\nkind: StatefulSet\nspec:\n  replicas: 2",
			want: []v1beta2.AppWrapperPodSet{ps("template.spec.template", 2)}},
		{name: "job default", yaml: "apiVersion: batch/v1\nkind: Job\nspec: {}",
			want: []v1beta2.AppWrapperPodSet{ps("template.spec.template", 1)}},
		{name: "job parallelism only", yaml: "apiVersion: batch/v1\nkind: Job\nspec:\n  parallelism: 5",
			want: []v1beta2.AppWrapperPodSet{ps("template.spec.template", 5)}},
		{name: "job completions only", yaml: "apiVersion: batch/v1\nkind: Job\nspec:\n  completions: 4",
			want: []v1beta2.AppWrapperPodSet{ps("template.spec.template", 1)}},
		{name: "job min", yaml: "apiVersion: batch/v1\nkind: Job\nspec:\n  parallelism: 4\n  completions: 2",
			want: []v1beta2.AppWrapperPodSet{ps("template.spec.template", 2)}},
		{name: "jobset", yaml: `
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
spec:
  replicatedJobs:
  - name: workers
    replicas: 2
    template:
      spec:
        parallelism: 4
        completions: 4
  - name: driver
    template:
      spec: {}
`, want: []v1beta2.AppWrapperPodSet{
			ps("template.spec.replicatedJobs[0].template.spec.template", 8),
			ps("template.spec.replicatedJobs[1].template.spec.template", 1),
		}},
		{name: "pytorchjob", yaml: `
apiVersion: kubeflow.org/v1
kind: PyTorchJob
spec:
  pytorchReplicaSpecs:
    Worker:
      replicas: 3
    Master:
      replicas: 1
`, want: []v1beta2.AppWrapperPodSet{
			ps("template.spec.pytorchReplicaSpecs.Master.template", 1),
			ps("template.spec.pytorchReplicaSpecs.Worker.template", 3),
		}},
		{name: "pytorchjob workers only", yaml: `
apiVersion: kubeflow.org/v1
kind: PyTorchJob
spec:
  pytorchReplicaSpecs:
    Worker: {}
`, want: []v1beta2.AppWrapperPodSet{ps("template.spec.pytorchReplicaSpecs.Worker.template", 1)}},
		{name: "raycluster", yaml: `
apiVersion: ray.io/v1
kind: RayCluster
spec:
  headGroupSpec: {}
  workerGroupSpecs:
  - replicas: 2
  - replicas: 2
    numOfHosts: 2
`, want: []v1beta2.AppWrapperPodSet{
			ps("template.spec.headGroupSpec.template", 1),
			ps("template.spec.workerGroupSpecs[0].template", 2),
			ps("template.spec.workerGroupSpecs[1].template", 4),
		}},
		{name: "rayjob", yaml: `
apiVersion: ray.io/v1
kind: RayJob
spec:
  rayClusterSpec:
    headGroupSpec: {}
    workerGroupSpecs:
    - {}
`, want: []v1beta2.AppWrapperPodSet{
			ps("template.spec.rayClusterSpec.headGroupSpec.template", 1),
			ps("template.spec.rayClusterSpec.workerGroupSpecs[0].template", 1),
		}},
		{name: "unknown kind", yaml: "apiVersion: v1\nkind: ConfigMap\ndata: {}"},
		{name: "unknown version", yaml: "apiVersion: batch/v2\nkind: Job\nspec: {}"},
		{name: "bad replicas", yaml: "apiVersion: apps/v1\nkind: Deployment\nspec:\n  replicas: two", err: "spec.replicas: two is not an integer"},
		{name: "negative parallelism", yaml: "apiVersion: batch/v1\nkind: Job\nspec:\n  parallelism: -1", err: "-1 replicas"},
		{name: "jobset not a list", yaml: "apiVersion: jobset.x-k8s.io/v1alpha2\nkind: JobSet\nspec:\n  replicatedJobs: {}", err: "not a list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := InferPodSets(decodeObj(t, tc.yaml))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %s, %v\nwant %s", describePodSets(got), err, describePodSets(tc.want))
			}
		})
	}
}

func component(t *testing.T, y string, declared ...v1beta2.AppWrapperPodSet) v1beta2.AppWrapperComponent {
	t.Helper()
	js, err := yamlutil.ToJSON([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return v1beta2.AppWrapperComponent{Template: runtime.RawExtension{Raw: js}, DeclaredPodSets: declared}
}

func TestEffectivePodSets(t *testing.T) {
	const job = `
apiVersion: batch/v1
kind: Job
metadata: {name: j}
spec:
  parallelism: 2
  template:
    spec:
      containers: [{name: c, image: x}]
`
	const custom = `
apiVersion: example.com/v1
kind: Trainer
metadata: {name: t}
spec:
  launcher:
    template:
      spec:
        containers: [{name: c, image: x}]
  workers:
  - template:
      spec:
        containers: [{name: c, image: x}]
`
	annotated := ps("template.spec.template", 2)
	annotated.Annotations = map[string]string{"a": "b"}
	for _, tc := range []struct {
		name string
		comp v1beta2.AppWrapperComponent
		want []v1beta2.AppWrapperPodSet
		err  string
	}{
		{name: "inferred", comp: component(t, job), want: []v1beta2.AppWrapperPodSet{ps("template.spec.template", 2)}},
		{name: "declared matching, annotations kept", comp: component(t, job, annotated), want: []v1beta2.AppWrapperPodSet{annotated}},
		{name: "declared wrong replicas", comp: component(t, job, ps("template.spec.template", 3)),
			err: "declared 3 replicas, the object has 2"},
		{name: "declared nil replicas is 1", comp: component(t, job, v1beta2.AppWrapperPodSet{Path: "template.spec.template"}),
			err: "declared 1 replicas, the object has 2"},
		{name: "declared too many", comp: component(t, job, ps("template.spec.template", 2), ps("template.spec.template", 2)),
			err: "declared 2 pod sets, the kind has 1"},
		{name: "declared bad path", comp: component(t, job, ps("template.spec.podTemplate", 2)),
			err: "template.spec.podTemplate not found"},
		{name: "unknown kind infers none", comp: component(t, custom)},
		{name: "unknown kind declared", comp: component(t, custom, ps("template.spec.launcher.template", 1), ps("template.spec.workers[0].template", 4)),
			want: []v1beta2.AppWrapperPodSet{ps("template.spec.launcher.template", 1), ps("template.spec.workers[0].template", 4)}},
		{name: "unknown kind, path out of range", comp: component(t, custom, ps("template.spec.workers[1].template", 4)),
			err: "podSets[0]: path \"template.spec.workers[1].template\": template.spec.workers[1] out of range"},
		{name: "no kind", comp: component(t, "apiVersion: v1\nmetadata: {name: x}"), err: "Object 'Kind' is missing"},
		{name: "empty template", comp: v1beta2.AppWrapperComponent{}, err: "empty template"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := EffectivePodSets(tc.comp)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, %v\nwant %+v", got, err, tc.want)
			}
		})
	}
}

func TestValidatePodSets(t *testing.T) {
	inferred := []v1beta2.AppWrapperPodSet{ps("template.spec.a", 1), ps("template.spec.b", 3)}
	for _, tc := range []struct {
		name     string
		declared []v1beta2.AppWrapperPodSet
		err      string
	}{
		{name: "same", declared: []v1beta2.AppWrapperPodSet{{Path: "template.spec.a"}, ps("template.spec.b", 3)}},
		{name: "order matters", declared: []v1beta2.AppWrapperPodSet{ps("template.spec.b", 3), ps("template.spec.a", 1)},
			err: `podSets[0]: declared path "template.spec.b", the kind's is "template.spec.a"`},
		{name: "fewer", declared: inferred[:1], err: "declared 1 pod sets, the kind has 2 (template.spec.a x1, template.spec.b x3)"},
		{name: "replicas", declared: []v1beta2.AppWrapperPodSet{ps("template.spec.a", 1), ps("template.spec.b", 2)},
			err: "podSets[1] (template.spec.b): declared 2 replicas, the object has 3"},
	} {
		err := ValidatePodSets(tc.declared, inferred)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || err.Error() != tc.err) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
		}
	}
}

func TestExpectedPodCount(t *testing.T) {
	aw := &v1beta2.AppWrapper{}
	if n := ExpectedPodCount(aw); n != 0 {
		t.Errorf("empty: %d", n)
	}
	aw.Status.ComponentStatus = []v1beta2.AppWrapperComponentStatus{
		{PodSets: []v1beta2.AppWrapperPodSet{ps("template", 4), {Path: "template.x"}}},
		{},
		{PodSets: []v1beta2.AppWrapperPodSet{ps("template", 0), ps("template", 2)}},
	}
	if n := ExpectedPodCount(aw); n != 7 {
		t.Errorf("got %d, want 7", n)
	}
}

func TestGetPodTemplate(t *testing.T) {
	obj := decodeObj(t, `
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: js}
spec:
  note: text
  replicatedJobs:
  - name: a
    template:
      spec:
        template:
          metadata:
            labels: {role: a}
          spec:
            containers: [{name: c, image: img-a}]
  - name: b
    template:
      spec:
        template:
          spec:
            containers: [{name: c, image: img-b}]
`).Object
	pt, err := GetPodTemplate(obj, "template.spec.replicatedJobs[1].template.spec.template")
	if err != nil || len(pt.Spec.Containers) != 1 || pt.Spec.Containers[0].Image != "img-b" {
		t.Fatalf("got %+v, %v", pt, err)
	}
	pt, err = GetPodTemplate(obj, "template.spec.replicatedJobs[0].template.spec.template")
	if err != nil || pt.Labels["role"] != "a" {
		t.Fatalf("got %+v, %v", pt, err)
	}
	pod := decodeObj(t, "apiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {x: \"y\"}}\nspec: {containers: [{name: c, image: i}]}")
	pt, err = GetPodTemplate(pod.Object, "template")
	if err != nil || pt.Labels["x"] != "y" || pt.Spec.Containers[0].Name != "c" {
		t.Fatalf("pod: %+v, %v", pt, err)
	}
	for path, want := range map[string]string{
		"spec.replicatedJobs":                         `must start with "template"`,
		"templates.spec":                              `unexpected 's' after template`,
		"template.spec.missing.template":              "template.spec.missing not found",
		"template.spec.replicatedJobs[2]":             "template.spec.replicatedJobs[2] out of range (2 elements)",
		"template.spec.replicatedJobs[-1]":            `index "-1" after template.spec.replicatedJobs`,
		"template.spec.replicatedJobs[x]":             `index "x"`,
		"template.spec.replicatedJobs[0":              "unclosed [",
		"template.spec[0]":                            "template.spec is not a list",
		"template.spec.replicatedJobs.template":       "template.spec.replicatedJobs is not an object",
		"template.spec.note":                          "not an object",
		"template..spec":                              "empty field after template",
		"template.spec.replicatedJobs[0].name.length": "template.spec.replicatedJobs[0].name is not an object",
	} {
		if _, err := GetPodTemplate(obj, path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", path, err, want)
		}
	}
}

func TestDecodeTemplateObject(t *testing.T) {
	pod := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Name: "p"}}
	obj, err := DecodeTemplate(runtime.RawExtension{Object: pod})
	if err != nil || obj.GetKind() != "Pod" || obj.GetName() != "p" {
		t.Fatalf("got %v, %v", obj, err)
	}
	if sets, err := InferPodSets(obj); err != nil || len(sets) != 1 || sets[0].Path != "template" {
		t.Errorf("pod sets %+v, %v", sets, err)
	}
	if _, err := DecodeTemplate(runtime.RawExtension{Object: &corev1.Pod{}}); err == nil || !strings.Contains(err.Error(), "apiVersion and kind are required") {
		t.Errorf("no kind: %v", err)
	}
}
