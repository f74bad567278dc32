// Package generate turns a short values file into a complete AppWrapper
// that runs ft-launcher: a headless Service and an Indexed Job whose pods
// each run one launcher, with the environment, rendezvous, termination
// message and restart settings the ft-launcher AppWrapper controller
// expects (docs/kubernetes.md, "Generating an AppWrapper"). It is what
// MLBatch's pytorchjob-generator is for a PyTorchJob: the few choices a
// user makes, and the rest done right.
package generate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
)

// Values is the values file. Only Name, Image, Nodes and Command are
// required.
type Values struct {
	// Name names the AppWrapper, its Job and its Service; pods are
	// <name>-<index>. A DNS label of at most 50 characters.
	Name      string `yaml:"name"`
	Namespace string `yaml:"namespace"` // default: none (kubectl's namespace)
	// Queue is the Kueue local queue (label kueue.x-k8s.io/queue-name);
	// MLBatch adds default-queue to an AppWrapper without one.
	Queue string `yaml:"queue"`

	Image            string   `yaml:"image"`
	ImagePullPolicy  string   `yaml:"imagePullPolicy"` // Always, IfNotPresent or Never; default: Kubernetes'
	ImagePullSecrets []string `yaml:"imagePullSecrets"`

	// Nodes is the number of training pods (one launcher each, all
	// active); Spares adds hot-spare pods beyond them (docs/spares.md).
	Nodes        int `yaml:"nodes"`
	Spares       int `yaml:"spares"`
	RanksPerNode int `yaml:"ranksPerNode"` // --nproc-per-node; default 1, or gpusPerNode when given

	// Command is the training program and its arguments, as after
	// torchrun's options: [train.py, --lr, "0.1"] (a script is run with
	// Python as torchrun does; with --no-python in launcherArgs, any
	// program).
	Command      []string `yaml:"command"`
	LauncherArgs []string `yaml:"launcherArgs"` // more ft-launcher flags, e.g. [--prewarm, auto]
	Launcher     string   `yaml:"launcher"`     // the launcher in the image; default ft-launcher (on PATH)
	MaxRestarts  *int     `yaml:"maxRestarts"`  // restarts in the pods before a reset; default 3

	// Resources per pod. GPUs are nvidia.com/gpu limits.
	GPUsPerNode   int    `yaml:"gpusPerNode"`
	CPUsPerNode   string `yaml:"cpusPerNode"`   // a quantity: "32", "500m"
	MemoryPerNode string `yaml:"memoryPerNode"` // a quantity: "256Gi"

	Env        map[string]string `yaml:"env"`
	Checkpoint *Checkpoint       `yaml:"checkpoint"`
	// HostNetwork runs the pods in the node's network namespace. Give
	// --rdzv-endpoint in launcherArgs then when Nodes > 1: the pods have
	// no DNS name of their own (docs/kubernetes.md).
	HostNetwork bool `yaml:"hostNetwork"`
	// SysNice adds the SYS_NICE capability, so --prewarm's standbys import
	// at low priority (docs/prewarm.md).
	SysNice bool `yaml:"sysNice"`

	// The AppWrapper's fault-tolerance annotations (docs/kubernetes.md,
	// "The contract"); empty keeps the controller's defaults.
	RetryLimit            *int   `yaml:"retryLimit"`
	AdmissionGracePeriod  string `yaml:"admissionGracePeriod"`
	WarmupGracePeriod     string `yaml:"warmupGracePeriod"`
	FailureGracePeriod    string `yaml:"failureGracePeriod"`
	RetryPausePeriod      string `yaml:"retryPausePeriod"`
	ForcefulDeletionGrace string `yaml:"forcefulDeletionGracePeriod"`
}

// Checkpoint is the volume the checkpoints go to, mounted in every pod: a
// PersistentVolumeClaim (ReadWriteMany, shared by the pods) or a host path.
type Checkpoint struct {
	ClaimName string `yaml:"claimName"`
	HostPath  string `yaml:"hostPath"`
	MountPath string `yaml:"mountPath"` // default /ckpt
}

// maxNameLen leaves room in a 63-character pod host name for "-<index>"
// and in the Job controller's pod names for its suffix.
const maxNameLen = 50

// Parse reads a values file strictly: an unknown key is an error naming
// it, so a misspelt option is never silently ignored.
func Parse(r io.Reader) (*Values, error) {
	dec := yaml.NewDecoder(r)
	dec.KnownFields(true)
	var v Values
	if err := dec.Decode(&v); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("values: empty file; name, image, nodes and command are required")
		}
		return nil, fmt.Errorf("values: %w", err)
	}
	return &v, nil
}

// validate checks v and fills in the defaults.
func (v *Values) validate() error {
	var errs []string
	bad := func(f string, a ...any) { errs = append(errs, fmt.Sprintf(f, a...)) }
	if v.Name == "" {
		bad("name is required")
	} else if msgs := validation.IsDNS1035Label(v.Name); len(msgs) > 0 || len(v.Name) > maxNameLen {
		bad("name %q: must be a DNS label (lower-case letters, digits and '-', starting with a letter) of at most %d characters", v.Name, maxNameLen)
	}
	if v.Namespace != "" {
		if msgs := validation.IsDNS1123Label(v.Namespace); len(msgs) > 0 {
			bad("namespace %q: must be a DNS label", v.Namespace)
		}
	}
	if v.Image == "" {
		bad("image is required")
	}
	switch corev1.PullPolicy(v.ImagePullPolicy) {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		bad("imagePullPolicy %q: must be Always, IfNotPresent or Never", v.ImagePullPolicy)
	}
	if v.Nodes < 1 {
		bad("nodes is %d: at least 1 training pod is required", v.Nodes)
	}
	if v.Spares < 0 {
		bad("spares is %d: must be 0 or more", v.Spares)
	}
	if v.GPUsPerNode < 0 {
		bad("gpusPerNode is %d: must be 0 or more", v.GPUsPerNode)
	}
	if v.RanksPerNode == 0 {
		v.RanksPerNode = max(v.GPUsPerNode, 1)
	}
	if v.RanksPerNode < 1 {
		bad("ranksPerNode is %d: must be 1 or more", v.RanksPerNode)
	}
	if len(v.Command) == 0 || v.Command[0] == "" {
		bad("command is required: the training program and its arguments, e.g. [train.py, --lr, \"0.1\"]")
	}
	if v.Launcher == "" {
		v.Launcher = "ft-launcher"
	}
	if v.MaxRestarts == nil {
		three := 3
		v.MaxRestarts = &three
	} else if *v.MaxRestarts < 0 {
		bad("maxRestarts is %d: must be 0 or more", *v.MaxRestarts)
	}
	if v.RetryLimit != nil && *v.RetryLimit < 0 {
		bad("retryLimit is %d: must be 0 or more", *v.RetryLimit)
	}
	for _, q := range []struct{ key, val string }{{"cpusPerNode", v.CPUsPerNode}, {"memoryPerNode", v.MemoryPerNode}} {
		if q.val != "" {
			if _, err := resource.ParseQuantity(q.val); err != nil {
				bad("%s %q: not a Kubernetes quantity (e.g. \"32\", \"500m\", \"256Gi\")", q.key, q.val)
			}
		}
	}
	for _, d := range []struct{ key, val string }{{"admissionGracePeriod", v.AdmissionGracePeriod}, {"warmupGracePeriod", v.WarmupGracePeriod},
		{"failureGracePeriod", v.FailureGracePeriod}, {"retryPausePeriod", v.RetryPausePeriod}, {"forcefulDeletionGracePeriod", v.ForcefulDeletionGrace}} {
		if d.val != "" {
			if x, err := time.ParseDuration(d.val); err != nil || x < 0 {
				bad("%s %q: must be a duration such as 90s or 5m", d.key, d.val)
			}
		}
	}
	for k := range v.Env {
		if msgs := validation.IsEnvVarName(k); len(msgs) > 0 {
			bad("env %q: not an environment variable name", k)
		}
		if k == "PET_NNODES" || strings.HasPrefix(k, "FTL_WORKLOAD") {
			bad("env %q: set by the generator or the controller; use nodes and spares", k)
		}
	}
	if c := v.Checkpoint; c != nil {
		if (c.ClaimName == "") == (c.HostPath == "") {
			bad("checkpoint: give exactly one of claimName (a PersistentVolumeClaim) and hostPath")
		}
		if c.MountPath == "" {
			c.MountPath = "/ckpt"
		}
		if !strings.HasPrefix(c.MountPath, "/") {
			bad("checkpoint.mountPath %q: must be an absolute path", c.MountPath)
		}
		if c.HostPath != "" && !strings.HasPrefix(c.HostPath, "/") {
			bad("checkpoint.hostPath %q: must be an absolute path", c.HostPath)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("values: %s", strings.Join(errs, "; "))
	}
	return nil
}

// AppWrapper builds the AppWrapper for v.
func AppWrapper(v *Values) (*v1beta2.AppWrapper, error) {
	if err := v.validate(); err != nil {
		return nil, err
	}
	svc := corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: v.Name},
		Spec: corev1.ServiceSpec{
			// Headless: a DNS name per pod, which the index-0 pod's
			// embedded etcd is reached by; named before the pod is ready.
			ClusterIP: corev1.ClusterIPNone, PublishNotReadyAddresses: true,
			Selector: map[string]string{batchv1.JobNameLabel: v.Name},
		},
	}
	job, err := v.job()
	if err != nil {
		return nil, err
	}
	aw := &v1beta2.AppWrapper{ObjectMeta: metav1.ObjectMeta{Name: v.Name, Namespace: v.Namespace, Annotations: v.annotations()}}
	aw.APIVersion, aw.Kind = v1beta2.GroupVersion.String(), "AppWrapper"
	if v.Queue != "" {
		aw.Labels = map[string]string{"kueue.x-k8s.io/queue-name": v.Queue}
	}
	for _, obj := range []any{svc, job} {
		raw, err := json.Marshal(obj)
		if err != nil {
			return nil, fmt.Errorf("generate: encode component: %w", err)
		}
		aw.Spec.Components = append(aw.Spec.Components, v1beta2.AppWrapperComponent{Template: runtime.RawExtension{Raw: raw}})
	}
	return aw, nil
}

func (v *Values) annotations() map[string]string {
	a := map[string]string{}
	set := func(k, val string) {
		if val != "" {
			a[k] = val
		}
	}
	if v.RetryLimit != nil {
		a[v1beta2.RetryLimitAnnotation] = strconv.Itoa(*v.RetryLimit)
	}
	set(v1beta2.AdmissionGracePeriodDurationAnnotation, v.AdmissionGracePeriod)
	set(v1beta2.WarmupGracePeriodDurationAnnotation, v.WarmupGracePeriod)
	set(v1beta2.FailureGracePeriodDurationAnnotation, v.FailureGracePeriod)
	set(v1beta2.RetryPausePeriodDurationAnnotation, v.RetryPausePeriod)
	set(v1beta2.ForcefulDeletionGracePeriodAnnotation, v.ForcefulDeletionGrace)
	if len(a) == 0 {
		return nil
	}
	return a
}

func (v *Values) job() (batchv1.Job, error) {
	pods := int32(v.Nodes + v.Spares)
	zero := int32(0)
	indexed := batchv1.IndexedCompletion
	no := false
	nnodes := strconv.Itoa(v.Nodes)
	if v.Spares > 0 {
		nnodes += ":" + strconv.Itoa(v.Nodes+v.Spares)
	}
	cmd := []string{v.Launcher, "--nproc-per-node", strconv.Itoa(v.RanksPerNode), "--max-restarts", strconv.Itoa(*v.MaxRestarts)}
	cmd = append(append(cmd, v.LauncherArgs...), v.Command...)
	env := []corev1.EnvVar{{Name: "PET_NNODES", Value: nnodes}}
	keys := make([]string, 0, len(v.Env))
	for k := range v.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, corev1.EnvVar{Name: k, Value: v.Env[k]})
	}
	c := corev1.Container{
		Name: "trainer", Image: v.Image, ImagePullPolicy: corev1.PullPolicy(v.ImagePullPolicy), Command: cmd, Env: env,
		// The launcher writes its verdict to /dev/termination-log; a
		// usage error writes none, and then the log's tail says why.
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	if v.SysNice {
		c.SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_NICE"}}}
	}
	res := corev1.ResourceList{}
	if v.GPUsPerNode > 0 {
		res["nvidia.com/gpu"] = *resource.NewQuantity(int64(v.GPUsPerNode), resource.DecimalSI)
	}
	if v.CPUsPerNode != "" {
		res[corev1.ResourceCPU] = resource.MustParse(v.CPUsPerNode)
	}
	if v.MemoryPerNode != "" {
		res[corev1.ResourceMemory] = resource.MustParse(v.MemoryPerNode)
	}
	if len(res) > 0 {
		c.Resources = corev1.ResourceRequirements{Limits: res, Requests: res}
	}
	pod := corev1.PodSpec{
		Subdomain: v.Name, RestartPolicy: corev1.RestartPolicyNever, HostNetwork: v.HostNetwork,
		// Training pods need no access to the API server.
		AutomountServiceAccountToken: &no,
		Containers:                   []corev1.Container{c},
	}
	for _, s := range v.ImagePullSecrets {
		pod.ImagePullSecrets = append(pod.ImagePullSecrets, corev1.LocalObjectReference{Name: s})
	}
	if ck := v.Checkpoint; ck != nil {
		vol := corev1.Volume{Name: "checkpoint"}
		if ck.ClaimName != "" {
			vol.PersistentVolumeClaim = &corev1.PersistentVolumeClaimVolumeSource{ClaimName: ck.ClaimName}
		} else {
			dir := corev1.HostPathDirectoryOrCreate
			vol.HostPath = &corev1.HostPathVolumeSource{Path: ck.HostPath, Type: &dir}
		}
		pod.Volumes = append(pod.Volumes, vol)
		pod.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "checkpoint", MountPath: ck.MountPath}}
	}
	return batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: v.Name},
		Spec: batchv1.JobSpec{
			CompletionMode: &indexed, Completions: &pods, Parallelism: &pods,
			// A failed pod is the AppWrapper's to handle, not the Job's: the
			// controller resets the whole workload (a new run), or fails it
			// on the launcher's no_restart verdict.
			BackoffLimit: &zero,
			Template:     corev1.PodTemplateSpec{Spec: pod},
		},
	}, nil
}

// YAML renders aw as YAML, with a header saying what made it. The
// fields an object to create leaves empty (status, creationTimestamp,
// empty resources) are left out.
func YAML(aw *v1beta2.AppWrapper, header string) ([]byte, error) {
	j, err := json.Marshal(aw)
	if err != nil {
		return nil, fmt.Errorf("generate: encode AppWrapper: %w", err)
	}
	var m any
	if err := json.Unmarshal(j, &m); err != nil {
		return nil, fmt.Errorf("generate: encode AppWrapper: %w", err)
	}
	j, err = json.Marshal(prune(m))
	if err != nil {
		return nil, fmt.Errorf("generate: encode AppWrapper: %w", err)
	}
	b, err := sigsyaml.JSONToYAML(j)
	if err != nil {
		return nil, fmt.Errorf("generate: encode AppWrapper: %w", err)
	}
	var out bytes.Buffer
	for _, l := range strings.Split(strings.TrimRight(header, "\n"), "\n") {
		if l != "" {
			out.WriteString("# " + l + "\n")
		}
	}
	out.Write(b)
	return out.Bytes(), nil
}

// prune drops null values and empty objects, recursively. (No field the
// generator sets is an empty object that means something, such as
// emptyDir: {}.)
func prune(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			e = prune(e)
			if m, ok := e.(map[string]any); e == nil || ok && len(m) == 0 {
				delete(x, k)
				continue
			}
			x[k] = e
		}
		return x
	case []any:
		for i := range x {
			x[i] = prune(x[i])
		}
	}
	return v
}
