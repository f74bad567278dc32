package appwrapper

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
