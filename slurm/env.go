// Package slurm is what the launcher needs from Slurm: the environment
// Slurm gives each task of a job step (Env), node lists (ExpandNodeList),
// the nodes that serve the rendezvous, and node addresses from scontrol
// (Scheduler.NodeAddr). It is the one place ft-launcher reads SLURM_*
// variables: configs uses the task rank to order nodes.
//
// The outer loop that chains Slurm jobs (ft-resumer) is package
// slurm/resumer, which builds on this one; nothing here imports it, so the
// launcher does not link the outer loop.
package slurm

import (
	"fmt"
	"strconv"
	"strings"
)

// Env is what Slurm told this task. Integer fields are -1 when the variable
// is unset, empty or not an integer >= 0 (the latter also listed in Invalid).
type Env struct {
	ProcID       int    // SLURM_PROCID: rank of this task in the job step
	NodeID       int    // SLURM_NODEID: index of this node in the allocation
	NNodes       int    // SLURM_NNODES, else SLURM_JOB_NUM_NODES
	JobID        string // SLURM_JOB_ID
	ArrayJobID   string // SLURM_ARRAY_JOB_ID: the array's job id, for array jobs
	ArrayTaskID  int    // SLURM_ARRAY_TASK_ID
	RestartCount int    // SLURM_RESTART_COUNT: times the job was requeued
	JobNodeList  string // SLURM_JOB_NODELIST, compressed as given ("node[01-04]")
	LocalID      int    // SLURM_LOCALID: rank of this task on its node
	NodeName     string // SLURMD_NODENAME: this node's Slurm name
	StepNodeList string // SLURM_STEP_NODELIST: the nodes of this srun step (unset in the batch script)

	// Invalid lists "NAME=value" for integer variables that were set but
	// are not integers >= 0, so the caller can warn about them.
	Invalid []string
}

// InJob reports whether the process runs inside a Slurm job.
func (e Env) InJob() bool { return e.JobID != "" }

// FromEnv reads the Slurm variables through getenv (os.Getenv in production).
func FromEnv(getenv func(string) string) Env {
	e := Env{
		JobID:        strings.TrimSpace(getenv("SLURM_JOB_ID")),
		ArrayJobID:   strings.TrimSpace(getenv("SLURM_ARRAY_JOB_ID")),
		JobNodeList:  strings.TrimSpace(getenv("SLURM_JOB_NODELIST")),
		NodeName:     strings.TrimSpace(getenv("SLURMD_NODENAME")),
		StepNodeList: strings.TrimSpace(getenv("SLURM_STEP_NODELIST")),
	}
	num := func(name string) int {
		v := strings.TrimSpace(getenv(name))
		if v == "" {
			return -1
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			e.Invalid = append(e.Invalid, fmt.Sprintf("%s=%q", name, v))
			return -1
		}
		return n
	}
	e.ProcID = num("SLURM_PROCID")
	e.NodeID = num("SLURM_NODEID")
	e.NNodes = num("SLURM_NNODES")
	if e.NNodes < 0 {
		e.NNodes = num("SLURM_JOB_NUM_NODES")
	}
	e.ArrayTaskID = num("SLURM_ARRAY_TASK_ID")
	e.RestartCount = num("SLURM_RESTART_COUNT")
	e.LocalID = num("SLURM_LOCALID")
	return e
}

// NodeList is the nodes the launchers run on: the step's when in an srun
// step (srun -N2 inside a 3-node job runs on two), else the job's.
func (e Env) NodeList() string {
	if e.StepNodeList != "" {
		return e.StepNodeList
	}
	return e.JobNodeList
}

// RunID names one run of the job: the job id (for an array task
// "<array job id>_<task id>", Slurm's own spelling) and "-r<N>" with N the
// requeue count (SLURM_RESTART_COUNT, 0 when unset). A requeued job keeps
// its id but is a new run: with an etcd that outlives the job, the old run's
// rounds must not be continued, so each requeue gets a run id of its own.
// "" outside a job.
func (e Env) RunID() string {
	if e.JobID == "" {
		return ""
	}
	id := e.JobID
	if e.ArrayJobID != "" && e.ArrayTaskID >= 0 {
		id = fmt.Sprintf("%s_%d", e.ArrayJobID, e.ArrayTaskID)
	}
	return fmt.Sprintf("%s-r%d", id, max(e.RestartCount, 0))
}
