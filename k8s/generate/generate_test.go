package generate

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
)

const minimal = `name: llama
image: registry.example.com/llama:1
nodes: 4
command: [train.py, --lr, "0.1"]
`

func build(t *testing.T, values string) (*v1beta2.AppWrapper, []byte, error) {
	t.Helper()
	v, err := Parse(strings.NewReader(values))
	if err != nil {
		return nil, nil, err
	}
	aw, err := AppWrapper(v)
	if err != nil {
		return nil, nil, err
	}
	b, err := YAML(aw, "test")
	if err != nil {
		t.Fatal(err)
	}
	return aw, b, nil
}

// components decodes the generated YAML as the API server would, strictly.
func components(t *testing.T, b []byte) (corev1.Service, batchv1.Job) {
	t.Helper()
	var aw v1beta2.AppWrapper
	if err := yaml.UnmarshalStrict(b, &aw); err != nil {
		t.Fatalf("generated YAML does not decode: %v\n%s", err, b)
	}
	if len(aw.Spec.Components) != 2 {
		t.Fatalf("%d components, want a Service and a Job", len(aw.Spec.Components))
	}
	var svc corev1.Service
	var job batchv1.Job
	if err := json.Unmarshal(aw.Spec.Components[0].Template.Raw, &svc); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(aw.Spec.Components[1].Template.Raw, &job); err != nil {
		t.Fatal(err)
	}
	return svc, job
}

func env(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func TestGenerate(t *testing.T) {
	tests := []struct {
		name   string
		values string
		check  func(t *testing.T, svc corev1.Service, job batchv1.Job, b []byte)
	}{
		{"minimal", minimal, func(t *testing.T, svc corev1.Service, job batchv1.Job, b []byte) {
			if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses || svc.Spec.Selector[batchv1.JobNameLabel] != "llama" {
				t.Errorf("service %+v: want headless, publishing not-ready pods, selecting the Job's pods", svc.Spec)
			}
			s := job.Spec
			if *s.CompletionMode != batchv1.IndexedCompletion || *s.Completions != 4 || *s.Parallelism != 4 || *s.BackoffLimit != 0 {
				t.Errorf("job spec: want Indexed, 4 pods, backoffLimit 0")
			}
			p := s.Template.Spec
			if p.Subdomain != "llama" || p.RestartPolicy != corev1.RestartPolicyNever || *p.AutomountServiceAccountToken {
				t.Errorf("pod spec: subdomain %q restartPolicy %q automount %v", p.Subdomain, p.RestartPolicy, *p.AutomountServiceAccountToken)
			}
			c := p.Containers[0]
			want := []string{"ft-launcher", "--nproc-per-node", "1", "--max-restarts", "3", "train.py", "--lr", "0.1"}
			if !slices.Equal(c.Command, want) || env(c, "PET_NNODES") != "4" {
				t.Errorf("command %q PET_NNODES %q, want %q and 4", c.Command, env(c, "PET_NNODES"), want)
			}
			if c.TerminationMessagePolicy != corev1.TerminationMessageFallbackToLogsOnError {
				t.Errorf("terminationMessagePolicy %q", c.TerminationMessagePolicy)
			}
			if strings.Contains(string(b), "status:") || strings.Contains(string(b), "creationTimestamp") {
				t.Errorf("empty fields in the output:\n%s", b)
			}
		}},
		{"gpus, spares, checkpoint claim, env, launcher args, annotations, queue", minimal + `spares: 1
gpusPerNode: 8
cpusPerNode: "64"
memoryPerNode: 512Gi
launcherArgs: [--prewarm, auto]
sysNice: true
env: {NCCL_DEBUG: WARN, A_FIRST: "1"}
checkpoint: {claimName: ckpt}
retryLimit: 5
failureGracePeriod: 30s
queue: team-a
`, func(t *testing.T, svc corev1.Service, job batchv1.Job, b []byte) {
			if *job.Spec.Completions != 5 {
				t.Errorf("completions %d, want 4 nodes + 1 spare", *job.Spec.Completions)
			}
			c := job.Spec.Template.Spec.Containers[0]
			if env(c, "PET_NNODES") != "4:5" || c.Env[1].Name != "A_FIRST" || env(c, "NCCL_DEBUG") != "WARN" {
				t.Errorf("env %+v: want PET_NNODES 4:5 then the user's, sorted", c.Env)
			}
			if !slices.Equal(c.Command[:7], []string{"ft-launcher", "--nproc-per-node", "8", "--max-restarts", "3", "--prewarm", "auto"}) {
				t.Errorf("command %q: 8 ranks (one per GPU), then the launcher args", c.Command)
			}
			if g := c.Resources.Limits["nvidia.com/gpu"]; g.Value() != 8 || c.Resources.Limits.Memory().String() != "512Gi" {
				t.Errorf("limits %v", c.Resources.Limits)
			}
			if c.SecurityContext == nil || !slices.Contains(c.SecurityContext.Capabilities.Add, "SYS_NICE") {
				t.Errorf("no SYS_NICE capability")
			}
			vol := job.Spec.Template.Spec.Volumes
			if len(vol) != 1 || vol[0].PersistentVolumeClaim == nil || vol[0].PersistentVolumeClaim.ClaimName != "ckpt" || c.VolumeMounts[0].MountPath != "/ckpt" {
				t.Errorf("volumes %+v mounts %+v", vol, c.VolumeMounts)
			}
			for _, s := range []string{"workload.codeflare.dev.appwrapper/retryLimit: \"5\"", "failureGracePeriodDuration: 30s", "kueue.x-k8s.io/queue-name: team-a"} {
				if !strings.Contains(string(b), s) {
					t.Errorf("output lacks %q:\n%s", s, b)
				}
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, b, err := build(t, tc.values)
			if err != nil {
				t.Fatal(err)
			}
			svc, job := components(t, b)
			tc.check(t, svc, job, b)
		})
	}
}

// TestGenerateRefuses: bad values are refused with an error that names the
// key and what it allows; nothing is written.
func TestGenerateRefuses(t *testing.T) {
	tests := []struct {
		name, values, want string
	}{
		{"empty", "", "name, image, nodes and command are required"},
		{"unknown key", minimal + "gpus: 8\n", "field gpus not found"},
		{"no image", "name: x\nnodes: 1\ncommand: [t.py]\n", "image is required"},
		{"bad name", strings.Replace(minimal, "llama", "Llama_1", 1), `name "Llama_1": must be a DNS label`},
		{"long name", strings.Replace(minimal, "llama", strings.Repeat("a", 51), 1), "at most 50 characters"},
		{"no nodes", strings.Replace(minimal, "nodes: 4", "nodes: 0", 1), "nodes is 0"},
		{"no command", strings.Replace(minimal, `command: [train.py, --lr, "0.1"]`, "", 1), "command is required"},
		{"bad quantity", minimal + "memoryPerNode: lots\n", `memoryPerNode "lots": not a Kubernetes quantity`},
		{"bad duration", minimal + "retryPausePeriod: soon\n", `retryPausePeriod "soon"`},
		{"two checkpoint volumes", minimal + "checkpoint: {claimName: a, hostPath: /b}\n", "exactly one of claimName"},
		{"reserved env", minimal + "env: {PET_NNODES: \"8\"}\n", `env "PET_NNODES": set by the generator`},
		{"pull policy", minimal + "imagePullPolicy: Sometimes\n", "must be Always, IfNotPresent or Never"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := build(t, tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
