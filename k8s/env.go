// Package k8s reads the environment Kubernetes gives a pod. It is the one
// place ft-launcher reads it: configs uses the Indexed Job completion index
// to order nodes, and a later Kubernetes adapter builds on Env instead of
// reading the environment again.
package k8s

import (
	"fmt"
	"strconv"
	"strings"
)

// Env is what Kubernetes told this pod.
type Env struct {
	// InPod: KUBERNETES_SERVICE_HOST is set, as in every pod.
	InPod bool
	// CompletionIndex is JOB_COMPLETION_INDEX of an Indexed Job; -1 when
	// unset or not an integer >= 0 (the latter also listed in Invalid).
	CompletionIndex int
	// Hostname is $HOSTNAME, the pod name.
	Hostname string
	// PodOrdinal is N of a StatefulSet-style pod name NAME-N; -1 when the
	// name has no such suffix. Any host name ending in -N parses, so it
	// means a pod ordinal only when InPod.
	PodOrdinal int

	// Invalid lists "NAME=value" for variables that were set but malformed.
	Invalid []string
}

// FromEnv reads the Kubernetes variables through getenv (os.Getenv in
// production).
func FromEnv(getenv func(string) string) Env {
	e := Env{
		InPod:           getenv("KUBERNETES_SERVICE_HOST") != "",
		CompletionIndex: -1,
		Hostname:        strings.TrimSpace(getenv("HOSTNAME")),
	}
	if v := strings.TrimSpace(getenv("JOB_COMPLETION_INDEX")); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 {
			e.CompletionIndex = n
		} else {
			e.Invalid = append(e.Invalid, fmt.Sprintf("JOB_COMPLETION_INDEX=%q", v))
		}
	}
	e.PodOrdinal, _ = PodOrdinal(e.Hostname)
	return e
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
