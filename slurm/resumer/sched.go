package resumer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ftlauncher/ft-launcher/slurm"
)

// Scheduler runs the Slurm client commands of the outer loop (sbatch,
// scontrol, sacct, scancel) through slurm.Scheduler. Env is their
// environment (nil: this process's), e.g. with SLURM_CONF.
type Scheduler struct {
	Env []string
}

func (s Scheduler) run(ctx context.Context, name string, args ...string) (string, error) {
	return slurm.Scheduler{Env: s.Env}.Run(ctx, name, args...)
}

// Nodes lists the cluster's nodes.
func (s Scheduler) Nodes(ctx context.Context) ([]slurm.NodeInfo, error) {
	return slurm.Scheduler{Env: s.Env}.Nodes(ctx)
}

// Submission is one sbatch call.
type Submission struct {
	Script     string   // the batch script
	Args       []string // extra sbatch options (the user's), before ours
	AfterNotOK string   // job id: --dependency=afternotok:ID --kill-on-invalid-dep=yes
	Exclude    []string // node names: --exclude
	Env        []string // extra KEY=VALUE exported to the job (sbatch exports the environment)
}

// Submit runs sbatch --parsable and returns the job id.
func (s Scheduler) Submit(ctx context.Context, sub Submission) (string, error) {
	// --no-requeue: the chain, not Slurm's requeue, continues the training
	// (a requeued job would run beside its own successor). The user's
	// options come after it and may say otherwise.
	args := append([]string{"--parsable", "--no-requeue"}, sub.Args...)
	if sub.AfterNotOK != "" {
		args = append(args, "--dependency=afternotok:"+sub.AfterNotOK, "--kill-on-invalid-dep=yes")
	}
	if len(sub.Exclude) > 0 {
		args = append(args, "--exclude="+strings.Join(sub.Exclude, ","))
	}
	args = append(args, sub.Script)
	// run's error names sbatch and its arguments, with what sbatch said.
	out, err := slurm.Scheduler{Env: append(submitEnv(envOrProcess(s.Env)), sub.Env...)}.Run(ctx, "sbatch", args...)
	if err != nil {
		return "", err
	}
	// --parsable prints "jobid" or "jobid;cluster".
	id, _, _ := strings.Cut(strings.TrimSpace(out), ";")
	if id == "" {
		return "", fmt.Errorf("sbatch: no job id in %q", out)
	}
	return id, nil
}

// Cancel runs scancel on the given jobs (already ended jobs are no error).
func (s Scheduler) Cancel(ctx context.Context, ids ...string) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := s.run(ctx, "scancel", ids...)
	return err
}

// SetExclude sets a pending job's excluded nodes (ExcNodeList): Slurm
// applies it when it places the job.
func (s Scheduler) SetExclude(ctx context.Context, id string, nodes []string) error {
	v := strings.Join(nodes, ",")
	if v == "" {
		v = "(null)"
	}
	_, err := s.run(ctx, "scontrol", "update", "JobId="+id, "ExcNodeList="+v)
	return err
}

// Job is Slurm's record of a job.
type Job struct {
	ID       string    `json:"id"`
	State    string    `json:"state"` // PENDING, RUNNING, COMPLETED, FAILED, TIMEOUT, ...
	Reason   string    `json:"reason,omitempty"`
	ExitCode int       `json:"exit_code"` // of the batch script
	Signal   int       `json:"signal"`    // that ended the batch script
	NodeList []string  `json:"node_list,omitempty"`
	NumNodes int       `json:"num_nodes,omitempty"`
	Start    time.Time `json:"start,omitzero"`
	End      time.Time `json:"end,omitzero"`
	Source   string    `json:"source"` // scontrol, sacct, sacct -c
}

// Terminal reports whether Slurm is done with the job.
func (j Job) Terminal() bool {
	switch j.State {
	case "", "PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD":
		return false
	}
	return true
}

// ErrUnknownJob is returned by Job when no source knows the job id.
var ErrUnknownJob = errors.New("slurm: unknown job")

// Job asks slurmctld (`scontrol show job -o`, which keeps finished jobs for
// MinJobAge) and falls back to accounting: `sacct`, or `sacct -c`
// (jobcomp/filetxt) where accounting storage is disabled.
func (s Scheduler) Job(ctx context.Context, id string) (Job, error) {
	out, err := s.run(ctx, "scontrol", "show", "job", "-o", id)
	if err == nil {
		for _, line := range strings.Split(out, "\n") {
			if j, ok := ParseScontrolJob(line); ok && j.ID == id {
				return j, nil
			}
		}
	}
	fields := "JobID,State,ExitCode,NodeList,Start,End,NNodes"
	for _, extra := range [][]string{nil, {"-c"}} {
		args := append(append([]string{}, extra...), "-n", "-X", "--parsable2", "-j", id, "-o", fields)
		out, serr := s.run(ctx, "sacct", args...)
		if serr != nil {
			continue
		}
		if j, ok := ParseSacct(out, id); ok {
			j.Source = strings.TrimSpace("sacct " + strings.Join(extra, " "))
			return j, nil
		}
	}
	if err != nil && !strings.Contains(err.Error(), "Invalid job id") {
		return Job{}, fmt.Errorf("slurm: job %s: %w", id, err)
	}
	return Job{}, fmt.Errorf("%w %s", ErrUnknownJob, id)
}

// ParseScontrolJob reads one line of `scontrol show job -o`.
func ParseScontrolJob(line string) (Job, bool) {
	kv := map[string]string{}
	for _, f := range strings.Fields(line) {
		if k, v, ok := strings.Cut(f, "="); ok {
			if _, dup := kv[k]; !dup {
				kv[k] = v
			}
		}
	}
	if kv["JobId"] == "" {
		return Job{}, false
	}
	j := Job{ID: kv["JobId"], State: kv["JobState"], Reason: kv["Reason"], Source: "scontrol"}
	j.ExitCode, j.Signal = parseExit(kv["ExitCode"])
	j.NodeList, _ = slurm.ExpandNodeList(kv["NodeList"])
	j.NumNodes, _ = strconv.Atoi(kv["NumNodes"])
	j.Start = parseTime(kv["StartTime"])
	j.End = parseTime(kv["EndTime"])
	if !j.Terminal() {
		j.End = time.Time{} // a running job's EndTime is its time limit
	}
	if j.State == "PENDING" {
		j.Start = time.Time{} // a pending job's StartTime is an estimate
	}
	return j, true
}

// ParseSacct reads `sacct -n -X --parsable2 -o
// JobID,State,ExitCode,NodeList,Start,End,NNodes` and returns the last record of id
// (a requeued job has one per run).
func ParseSacct(out, id string) (Job, bool) {
	var j Job
	found := false
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(strings.TrimSpace(line), "|")
		if len(f) < 6 || f[0] != id {
			continue
		}
		state, _, _ := strings.Cut(f[1], " ") // "CANCELLED by 0"
		j = Job{ID: id, State: state}
		j.ExitCode, j.Signal = parseExit(f[2])
		j.NodeList, _ = slurm.ExpandNodeList(f[3])
		j.Start, j.End = parseTime(f[4]), parseTime(f[5])
		if len(f) > 6 {
			j.NumNodes, _ = strconv.Atoi(f[6])
		}
		found = true
	}
	return j, found
}

func parseExit(s string) (code, sig int) {
	a, b, _ := strings.Cut(s, ":")
	code, _ = strconv.Atoi(a)
	sig, _ = strconv.Atoi(b)
	return code, sig
}

// parseTime reads Slurm's local-time timestamps; "Unknown", "None" and
// empty are zero.
func parseTime(s string) time.Time {
	t, err := time.ParseInLocation("2006-01-02T15:04:05", s, time.Local)
	if err != nil {
		return time.Time{}
	}
	return t
}

func envOrProcess(env []string) []string {
	if env != nil {
		return append([]string{}, env...)
	}
	return os.Environ()
}

// submitEnv drops the submitting job's own identity (SLURM_* but
// SLURM_CONF) from what sbatch exports to the next job: a successor
// submitted from inside a job must not start with its predecessor's
// SLURM_JOB_ID, node list or dependency.
func submitEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if strings.HasPrefix(kv, "SLURM_") && !strings.HasPrefix(kv, "SLURM_CONF=") {
			continue
		}
		out = append(out, kv)
	}
	return out
}
