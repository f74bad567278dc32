package appwrapper

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestNoExecuteResources(t *testing.T) {
	ap := DefaultConfig().Autopilot
	ap.ResourceTaints["example.com/nic"] = []corev1.Taint{
		{Key: "nic-health", Value: "DOWN", Effect: corev1.TaintEffectNoExecute},
		{Key: "autopilot.ibm.com/gpuhealth", Value: "EVICT", Effect: corev1.TaintEffectNoExecute},
	}
	node := func(labels map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: labels}}
	}
	for _, tc := range []struct {
		name   string
		node   *corev1.Node
		want   []string
		config *AutopilotConfig
	}{
		{name: "nil node"},
		{name: "no labels", node: node(nil)},
		{name: "evict", node: node(map[string]string{"autopilot.ibm.com/gpuhealth": "EVICT"}), want: []string{"example.com/nic", "nvidia.com/gpu"}},
		{name: "warn is PreferNoSchedule", node: node(map[string]string{"autopilot.ibm.com/gpuhealth": "WARN"})},
		{name: "testing is NoSchedule", node: node(map[string]string{"autopilot.ibm.com/gpuhealth": "TESTING"})},
		{name: "other resource", node: node(map[string]string{"nic-health": "DOWN", "autopilot.ibm.com/gpuhealth": "PASS"}), want: []string{"example.com/nic"}},
		{name: "spec.taints are not labels", node: &corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{
			{Key: "autopilot.ibm.com/gpuhealth", Value: "EVICT", Effect: corev1.TaintEffectNoExecute}}}}},
		{name: "no configuration", node: node(map[string]string{"autopilot.ibm.com/gpuhealth": "EVICT"}), config: &AutopilotConfig{}},
	} {
		c := ap
		if tc.config != nil {
			c = *tc.config
		}
		if got := NoExecuteResources(tc.node, c); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}
