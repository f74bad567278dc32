// Package k8s reads what Kubernetes gives a pod: its environment (the
// Indexed Job completion index, the host name, the variables the
// ft-launcher controller injects) and the /etc/hosts line the kubelet
// writes for a pod with a subdomain. It is the one place ft-launcher reads
// them: configs builds the in-pod defaults on Env instead of reading the
// environment again. It imports no Kubernetes client library, so that the
// launcher binary stays small.
package k8s

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Variables read by FromEnv besides KUBERNETES_SERVICE_HOST,
// JOB_COMPLETION_INDEX and HOSTNAME. The ft-launcher controller injects
// EnvWorkload and EnvWorkloadResets into every container of the pods of an
// AppWrapper it manages; the others are set by the user.
const (
	// EnvWorkload is "<namespace>/<name>" of the AppWrapper.
	EnvWorkload = "FTL_WORKLOAD"
	// EnvWorkloadResets is the AppWrapper's status.resettingCount when its
	// resources were created: each reset is a new run.
	EnvWorkloadResets = "FTL_WORKLOAD_RESETS"
	// EnvJobSetRestartAttempt is a JobSet's restart attempt, passed through
	// the downward API from the pod annotation JobSetRestartAnnotation.
	EnvJobSetRestartAttempt = "JOBSET_RESTART_ATTEMPT"
	// EnvRdzvService is a DNS name (optionally :PORT) of a Service that
	// reaches the index-0 pod; it replaces the endpoint derived from the
	// pod's subdomain.
	EnvRdzvService = "FTL_RDZV_SERVICE"
)

// JobSetRestartAnnotation is the pod annotation (and label) in which JobSet
// records its restart attempt.
const JobSetRestartAnnotation = "jobset.sigs.k8s.io/restart-attempt"

// Env is what Kubernetes told this pod.
type Env struct {
	// InPod: KUBERNETES_SERVICE_HOST is set, as in every pod.
	InPod bool
	// CompletionIndex is JOB_COMPLETION_INDEX of an Indexed Job (a JobSet's
	// jobs are Indexed Jobs); -1 when unset or not an integer >= 0 (the
	// latter also listed in Invalid).
	CompletionIndex int
	// Hostname is $HOSTNAME, the pod's host name: the pod name, or
	// "<job name>-<index>" in an Indexed Job, which sets spec.hostname.
	Hostname string
	// PodOrdinal is N of a StatefulSet-style host name NAME-N; -1 when the
	// name has no such suffix. Any host name ending in -N parses, so it
	// means a pod ordinal only when InPod.
	PodOrdinal int

	// WorkloadNamespace and WorkloadName are FTL_WORKLOAD split; "" unset.
	WorkloadNamespace, WorkloadName string
	// WorkloadResets is FTL_WORKLOAD_RESETS; -1 unset.
	WorkloadResets int
	// JobSetRestartAttempt is JOBSET_RESTART_ATTEMPT; -1 unset.
	JobSetRestartAttempt int
	// RdzvService is FTL_RDZV_SERVICE as given (trimmed), checked as an
	// endpoint by configs, which owns the endpoint syntax.
	RdzvService string

	// DNS is this pod's name under its subdomain, from /etc/hosts; zero
	// until the caller reads the file (ParseHosts).
	DNS PodDNS

	// Invalid lists "NAME=value" for variables Kubernetes sets that were
	// malformed; they are ignored with a warning.
	Invalid []string
	// Errors are variables the user or the controller set that are
	// malformed: a launch line with one is refused.
	Errors []*VarError
}

// VarError is a variable that is set but malformed.
type VarError struct {
	Name  string // the variable
	Value string // its value
	Want  string // what is allowed
}

func (e *VarError) Error() string { return fmt.Sprintf("%s=%q: %s", e.Name, e.Value, e.Want) }

// FromEnv reads the Kubernetes variables through getenv (os.Getenv in
// production).
func FromEnv(getenv func(string) string) Env {
	e := Env{
		InPod:                getenv("KUBERNETES_SERVICE_HOST") != "",
		CompletionIndex:      -1,
		Hostname:             strings.TrimSpace(getenv("HOSTNAME")),
		WorkloadResets:       -1,
		JobSetRestartAttempt: -1,
		RdzvService:          strings.TrimSpace(getenv(EnvRdzvService)),
	}
	if v := strings.TrimSpace(getenv("JOB_COMPLETION_INDEX")); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 {
			e.CompletionIndex = n
		} else {
			e.Invalid = append(e.Invalid, fmt.Sprintf("JOB_COMPLETION_INDEX=%q", v))
		}
	}
	e.SetHostname(e.Hostname)
	if v := strings.TrimSpace(getenv(EnvWorkload)); v != "" {
		ns, name, err := parseWorkload(v)
		if err != nil {
			e.Errors = append(e.Errors, &VarError{EnvWorkload, v, err.Error()})
		}
		e.WorkloadNamespace, e.WorkloadName = ns, name
	}
	e.WorkloadResets = e.count(getenv, EnvWorkloadResets, "the AppWrapper's status.resettingCount")
	e.JobSetRestartAttempt = e.count(getenv, EnvJobSetRestartAttempt,
		"the JobSet restart attempt (downward API: metadata.annotations['"+JobSetRestartAnnotation+"'])")
	return e
}

// SetHostname sets the host name (the caller's fallback when HOSTNAME is
// unset) and the pod ordinal parsed from it. With setHostnameAsFQDN the
// host name is the pod's FQDN; its first label is the pod's own name.
func (e *Env) SetHostname(h string) {
	e.Hostname = h
	e.PodOrdinal, _ = PodOrdinal(shortName(h))
}

// count reads a count variable: "" (unset) is -1; anything but an integer
// from 0 to 2^31-1 (Kubernetes counts are int32) is an error.
func (e *Env) count(getenv func(string) string, name, what string) int {
	v := strings.TrimSpace(getenv(name))
	if v == "" {
		return -1
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > math.MaxInt32 {
		e.Errors = append(e.Errors, &VarError{name, v, "must be an integer from 0 to 2147483647: " + what})
		return -1
	}
	return n
}

// Index is this pod's place in its workload, which orders the nodes:
// JOB_COMPLETION_INDEX, else the pod ordinal of a StatefulSet-style host
// name. from names the source; n is -1 (from "") when neither is known.
func (e Env) Index() (n int, from string) {
	switch {
	case e.CompletionIndex >= 0:
		return e.CompletionIndex, "JOB_COMPLETION_INDEX"
	case e.InPod && e.PodOrdinal >= 0:
		return e.PodOrdinal, fmt.Sprintf("pod ordinal of HOSTNAME=%s", e.Hostname)
	}
	return -1, ""
}

// Base is the name this pod's host name is numbered under: the Job of an
// Indexed Job pod ("train" for host name "train-3" with index 3), the
// StatefulSet of an ordinal. "" when the host name does not end in
// "-<Index>".
func (e Env) Base() string {
	n, _ := e.Index()
	if n < 0 {
		return ""
	}
	base, ok := strings.CutSuffix(shortName(e.Hostname), "-"+strconv.Itoa(n))
	if !ok || base == "" {
		return ""
	}
	return base
}

// RunID is the run id the pod's workload implies, and where it came from:
//
//   - FTL_WORKLOAD set (an AppWrapper): "<name>-r<FTL_WORKLOAD_RESETS>",
//     so each reset of the AppWrapper is a new run;
//   - an Indexed Job pod (a JobSet's included): the Job's name, from the
//     host name "<job>-<index>"; with JOBSET_RESTART_ATTEMPT
//     "<job>-r<attempt>", as a JobSet restart recreates its Jobs under the
//     same names. A pod the Job controller replaces keeps the run id, so
//     it rejoins the run.
//
// "" when neither applies. Names are DNS names, so the id holds only
// [a-z0-9.-]: it is safe as an etcd key part and a directory name.
func (e Env) RunID() (id, from string) {
	if e.WorkloadName != "" {
		r := max(e.WorkloadResets, 0)
		return fmt.Sprintf("%s-r%d", e.WorkloadName, r),
			fmt.Sprintf("%s=%s/%s, %s=%d", EnvWorkload, e.WorkloadNamespace, e.WorkloadName, EnvWorkloadResets, r)
	}
	job := e.Base()
	if e.CompletionIndex < 0 || job == "" {
		return "", ""
	}
	from = fmt.Sprintf("Indexed Job %s from HOSTNAME=%s", job, e.Hostname)
	if e.JobSetRestartAttempt >= 0 {
		return fmt.Sprintf("%s-r%d", job, e.JobSetRestartAttempt),
			fmt.Sprintf("%s, %s=%d", from, EnvJobSetRestartAttempt, e.JobSetRestartAttempt)
	}
	return job, from
}

// PeerFQDN is the DNS name of the pod numbered index under this pod's Base
// and subdomain ("train-0.train.ns.svc.cluster.local"); "" when the pod
// has no subdomain in /etc/hosts or no Base.
func (e Env) PeerFQDN(index int) string {
	base := e.Base()
	if base == "" || e.DNS.FQDN == "" {
		return ""
	}
	return e.DNS.Name(base + "-" + strconv.Itoa(index))
}

// PodOrdinal parses the ordinal of a StatefulSet pod name ("trainer-3" is
// 3). ok is false, and n -1, when the name does not end in -N.
func PodOrdinal(hostname string) (n int, ok bool) {
	i := strings.LastIndexByte(hostname, '-')
	if i <= 0 || i == len(hostname)-1 {
		return -1, false
	}
	digits := hostname[i+1:]
	for _, c := range digits {
		if c < '0' || c > '9' {
			return -1, false
		}
	}
	n, err := strconv.Atoi(digits)
	if err != nil {
		return -1, false
	}
	return n, true
}

// shortName is a host name's first label.
func shortName(h string) string {
	name, _, _ := strings.Cut(h, ".")
	return name
}

// parseWorkload splits "<namespace>/<name>": the namespace a DNS label, the
// name a DNS subdomain, as Kubernetes requires of an AppWrapper's.
func parseWorkload(v string) (ns, name string, err error) {
	ns, name, ok := strings.Cut(v, "/")
	bad := fmt.Errorf("must be <namespace>/<name> of the AppWrapper (set by the ft-launcher controller), " +
		"a DNS label and a DNS subdomain name: lower-case letters, digits, '-' (and '.' in the name)")
	if !ok || !isDNSLabel(ns) || !isDNSSubdomain(name) {
		return "", "", bad
	}
	return ns, name, nil
}

// isDNSLabel: RFC 1123 label, as Kubernetes checks namespaces: at most 63
// of [a-z0-9-], starting and ending with a letter or digit.
func isDNSLabel(s string) bool {
	if s == "" || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// isDNSSubdomain: RFC 1123 subdomain, as Kubernetes checks object names: at
// most 253 characters of dot-separated labels.
func isDNSSubdomain(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if !isDNSLabel(l) {
			return false
		}
	}
	return true
}
