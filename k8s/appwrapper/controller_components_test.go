package appwrapper

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
)

// TestComponentFailed: only batch Jobs and PyTorchJobs are read for a
// Failed=True condition (assess.go, rung 4); other kinds never fail.
func TestComponentFailed(t *testing.T) {
	obj := func(apiVersion, kind, status string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind}}
		if status != "" {
			u.Object["status"] = map[string]any{"conditions": []any{
				map[string]any{"type": "Complete", "status": "False"},
				map[string]any{"type": "Failed", "status": status},
			}}
		}
		return u
	}
	for _, tc := range []struct {
		obj  *unstructured.Unstructured
		want bool
	}{
		{obj("batch/v1", "Job", "True"), true},
		{obj("batch/v1", "Job", "False"), false},
		{obj("batch/v1", "Job", ""), false},
		{obj("kubeflow.org/v1", "PyTorchJob", "True"), true},
		{obj("kubeflow.org/v1", "PyTorchJob", "False"), false},
		{obj("ray.io/v1", "RayJob", "True"), false},
		{obj("apps/v1", "Deployment", "True"), false},
	} {
		if got := componentFailed(tc.obj); got != tc.want {
			t.Errorf("%s %v: failed = %v, want %v", tc.obj.GetKind(), tc.obj.Object["status"], got, tc.want)
		}
	}
}

// TestStatusOnlyComponents: an AppWrapper update that changed only
// status.componentStatus queues nothing; any other change does.
func TestStatusOnlyComponents(t *testing.T) {
	base := &v1beta2.AppWrapper{
		ObjectMeta: metav1.ObjectMeta{Name: "a", Generation: 1, ResourceVersion: "1", Labels: map[string]string{"l": "1"},
			Annotations: map[string]string{"a": "1"}, Finalizers: []string{v1beta2.Finalizer}},
		Status: v1beta2.AppWrapperStatus{Phase: v1beta2.AppWrapperResuming,
			ComponentStatus: []v1beta2.AppWrapperComponentStatus{{Name: "j", Kind: "Job", APIVersion: "batch/v1"}}},
	}
	now := metav1.Now()
	for _, tc := range []struct {
		name string
		edit func(*v1beta2.AppWrapper)
		want bool
	}{
		{"component condition", func(a *v1beta2.AppWrapper) {
			a.Status.ComponentStatus[0].Conditions = []metav1.Condition{{Type: "ResourcesDeployed", Status: "False", Reason: ReasonComponentCreationErrored}}
		}, true},
		{"component name", func(a *v1beta2.AppWrapper) { a.Status.ComponentStatus[0].Name = "j-x7k2p" }, true},
		{"nothing but the resourceVersion", func(*v1beta2.AppWrapper) {}, false},
		{"phase", func(a *v1beta2.AppWrapper) { a.Status.Phase = v1beta2.AppWrapperRunning }, false},
		{"a condition", func(a *v1beta2.AppWrapper) {
			a.Status.Conditions = []metav1.Condition{{Type: string(v1beta2.Unhealthy), Status: "True", Reason: ReasonCreateFailed}}
		}, false},
		{"retries", func(a *v1beta2.AppWrapper) { a.Status.Retries = 1 }, false},
		{"generation (spec)", func(a *v1beta2.AppWrapper) { a.Generation = 2 }, false},
		{"annotation", func(a *v1beta2.AppWrapper) { a.Annotations["a"] = "2" }, false},
		{"label", func(a *v1beta2.AppWrapper) { a.Labels["l"] = "2" }, false},
		{"finalizer", func(a *v1beta2.AppWrapper) { a.Finalizers = nil }, false},
		{"deletion", func(a *v1beta2.AppWrapper) { a.DeletionTimestamp = &now }, false},
		{"component status and phase", func(a *v1beta2.AppWrapper) {
			a.Status.ComponentStatus[0].Name = "k"
			a.Status.Phase = v1beta2.AppWrapperRunning
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := base.DeepCopy()
			n.ResourceVersion = "2"
			tc.edit(n)
			if got := statusOnlyComponents(base, n); got != tc.want {
				t.Errorf("statusOnlyComponents = %v, want %v", got, tc.want)
			}
		})
	}
}
