package agent

import (
	"slices"
	"strconv"
	"strings"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/monitor/ftwire"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/spawn"
)

// WorkerArgv is the command of one rank, as torchrun builds it:
// [python, -u, (-m), script, args...], or [script, args...] with --no-python,
// with ${local_rank} substituted in the script arguments.
func WorkerArgv(cfg *configs.Config, localRank int) []string {
	lr := strconv.Itoa(localRank)
	args := make([]string, len(cfg.ScriptArgs))
	for i, s := range cfg.ScriptArgs {
		args[i] = strings.ReplaceAll(s, "${local_rank}", lr)
	}
	if cfg.NoPython {
		return append([]string{cfg.Script}, args...)
	}
	argv := []string{cfg.PythonExec, "-u"}
	if cfg.Module {
		argv = append(argv, "-m")
	}
	argv = append(argv, cfg.Script)
	return append(argv, args...)
}

// Sockets names the rank monitors' sockets (*monitor.Manager).
type Sockets interface {
	RankSocket(localRank int) string
	LauncherSocket() string
}

// WorkerEnv is the environment of one rank: the launcher's environment with
// torchrun's worker variables and nvrx's monitor sockets set on top.
// TORCHELASTIC_RESTART_COUNT is the job-wide round number (every restart
// cycle, spare swaps included, so it is the same on every node);
// TORCHELASTIC_MAX_RESTARTS is the job's agreed budget and
// FT_LAUNCHER_RESTARTS_USED the part of it already spent. With
// cfg.AgentStore, MASTER_ADDR:MASTER_PORT is the store the launcher of
// group rank 0 serves (TORCHELASTIC_USE_AGENT_STORE=True: torch connects
// every rank, rank 0 included, as a client and prefixes its keys with
// /worker/attempt_<TORCHELASTIC_RESTART_COUNT>); without it rank 0 hosts
// the store there.
func WorkerEnv(base []string, cfg *configs.Config, asg rendezvous.Assignment, localRank int, errorFile string, mon Sockets) []string {
	set := map[string]string{
		"LOCAL_RANK":                   strconv.Itoa(localRank),
		"RANK":                         strconv.Itoa(asg.RankBase + localRank),
		"GROUP_RANK":                   strconv.Itoa(asg.GroupRank),
		"ROLE_RANK":                    strconv.Itoa(asg.RankBase + localRank),
		"ROLE_NAME":                    cfg.Role,
		"LOCAL_WORLD_SIZE":             strconv.Itoa(cfg.NProcPerNode),
		"WORLD_SIZE":                   strconv.Itoa(asg.WorldSize),
		"GROUP_WORLD_SIZE":             strconv.Itoa(asg.GroupWorldSize),
		"ROLE_WORLD_SIZE":              strconv.Itoa(asg.WorldSize),
		"MASTER_ADDR":                  asg.MasterAddr,
		"MASTER_PORT":                  strconv.Itoa(asg.MasterPort),
		"TORCHELASTIC_RESTART_COUNT":   strconv.Itoa(asg.Round),
		"TORCHELASTIC_MAX_RESTARTS":    strconv.Itoa(asg.MaxRestarts),
		"FT_LAUNCHER_RESTARTS_USED":    strconv.Itoa(asg.RestartsUsed),
		"TORCHELASTIC_RUN_ID":          asg.RunID,
		"TORCHELASTIC_USE_AGENT_STORE": torchBool(cfg.AgentStore),
		"TORCHELASTIC_ERROR_FILE":      errorFile,
	}
	if mon != nil {
		set["FT_RANK_MONITOR_IPC_SOCKET"] = mon.RankSocket(localRank)
		set[ftwire.ProtocolEnv] = ftwire.Protocol
		set["FT_LAUNCHER_IPC_SOCKET"] = mon.LauncherSocket()
	}
	have := map[string]bool{}
	out := make([]string, 0, len(base)+len(set)+2)
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, override := set[k]; override {
			continue
		}
		have[k] = true
		out = append(out, kv)
	}
	if !have["TORCH_NCCL_ASYNC_ERROR_HANDLING"] {
		set["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
	}
	if !have["OMP_NUM_THREADS"] && cfg.NProcPerNode > 1 {
		set["OMP_NUM_THREADS"] = "1"
	}
	if !have["TORCH_ELASTIC_WORKER_IDENTICAL"] {
		set["TORCH_ELASTIC_WORKER_IDENTICAL"] = "1"
	}
	for k, v := range set {
		out = append(out, k+"="+v)
	}
	return out
}

// assignmentVars are the variables of WorkerEnv that depend on a
// round's assignment (rank numbers, world, store, round, budget, error
// file): a parked spare does not know them yet.
var assignmentVars = []string{"RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
	"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "FT_LAUNCHER_RESTARTS_USED",
	"TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"}

// SpareEnv is the environment a parked spare gives the standby of one
// local rank: WorkerEnv without the assignment's variables (unset, never
// stale: the handover gives the rank its whole environment), with what
// the node knows already (LOCAL_RANK, LOCAL_WORLD_SIZE, the monitor
// sockets, OMP_NUM_THREADS, the launcher's environment).
func SpareEnv(base []string, cfg *configs.Config, localRank int, mon Sockets) []string {
	env := WorkerEnv(base, cfg, rendezvous.Assignment{}, localRank, "", mon)
	out := env[:0]
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(assignmentVars, k) {
			out = append(out, kv)
		}
	}
	return out
}

// spareSpecs are the ranks this node would start, for the standbys it
// keeps while parked: the same commands as the active nodes' ranks (one
// launch line for every node), SpareEnv's environment.
func (a *Agent) spareSpecs() []spawn.Spec {
	specs := make([]spawn.Spec, a.cfg.NProcPerNode)
	for lr := range specs {
		var mon Sockets
		if a.d.Monitors != nil {
			mon = a.d.Monitors
		}
		specs[lr] = spawn.Spec{LocalRank: lr, Argv: WorkerArgv(a.cfg, lr), Env: SpareEnv(a.d.Environ, a.cfg, lr, mon)}
	}
	return specs
}

// torchBool spells b as torch's elastic variables expect it.
func torchBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}
