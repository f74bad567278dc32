package configs

import (
	"fmt"
	"sort"
	"strings"
)

// Usage returns the full --help text: every flag grouped by purpose with its
// PET_ variable and default, the precedence rules and the legacy spellings.
func Usage() string {
	var b strings.Builder
	b.WriteString(`Usage: ft-launcher [options] TRAINING_SCRIPT [SCRIPT ARGS...]
       ft-launcher [options] -m MODULE [ARGS...]
       ft-launcher [options] --no-python EXECUTABLE [ARGS...]

Fault-tolerant, torchrun-compatible launcher for distributed PyTorch. It starts
--nproc-per-node workers on this node, watches them (heartbeats and sections from
the nvrx fault tolerance client), and restarts every worker of the job when one
fails or hangs, up to --max-restarts times.

Rules:
  * Options come before the training script. The first argument that is not an
    option is the script; everything after it is passed to the script untouched,
    even words that look like options. A bare -- ends the options; the word after
    it is the script. ${local_rank} in script arguments becomes each worker's
    local rank.
  * Values: --name value or --name=value. Every '-' inside a long name may be
    written '_' (--nproc_per_node, --ft-rank_heartbeat_timeout, --ft_segment).
    Abbreviated names are not accepted.
  * Precedence: command-line flag > PET_<NAME> environment variable > YAML file
    (--ft-cfg-path, fault_tolerance section) > default. The --ft-* fault
    tolerance fields have no PET_ variable (as in nvrx); PET_FT_CFG_PATH does
    exist. An empty variable counts as unset. For switches the PET_ value must
    be an integer: 0 off, anything else on.
  * Timeouts written none, null or '' (any case) are disabled.
  * Numbers are bounded and must be finite (nan and inf are refused): seconds
    0 to 604800 (7 days; at least 0.001 where > 0 is required), counts as
    each option says. The --ft-cfg-path file may hold at most 1 MiB and
    100000 YAML nodes with aliases expanded.
  * The worker interpreter is $PYTHON_EXEC, else python3 found on PATH; it runs
    as PYTHON -u [-m] SCRIPT ARGS.
`)
	opts := options()
	for _, g := range groupOrder() {
		fmt.Fprintf(&b, "\n%s:\n", g)
		for _, o := range opts {
			if o.group != g {
				continue
			}
			b.WriteString(optionHelp(o))
		}
	}
	b.WriteString("\nOther:\n  -h, --help\n        Print this help and exit.\n  --version\n        Print the version (release, commit, Go version, platform) and exit.\n")

	b.WriteString("\nLegacy spellings (accepted with a deprecation warning):\n")
	var legacy []string
	for _, o := range opts {
		for _, l := range o.legacy {
			legacy = append(legacy, fmt.Sprintf("  --%s -> --%s\n", l, o.names[0]))
		}
	}
	sort.Strings(legacy)
	b.WriteString(strings.Join(legacy, ""))
	b.WriteString("  (--ft-param-* also with underscores: --ft-param-rank_section_timeouts, --ft_param_enable_nic_monitor)\n")

	b.WriteString(`
YAML file (--ft-cfg-path): the first fault_tolerance: mapping anywhere in the
document is used, so NeMo/Hydra files with a nested section work. Keys are the
nvrx field names (the --ft-* flag without --ft-, '-' as '_'; the storage path
list is storage_healthcheck_path); num_warmup_iterations is YAML only. Unknown
keys are ignored with a warning. The launcher options verdict_file
(--verdict-file) and termination_log (--termination-log) may be set there too. rank_termination_signal and log_level
take a name or a number, timeouts a number or null. Example:

  fault_tolerance:
    rank_heartbeat_timeout: 300
    rank_section_timeouts: {setup: 600, step: 180, checkpointing: null}
    rank_termination_signal: SIGTERM

Exit status: 0 success, 1 failure, 2 bad usage, --ft-no-restart-exit-code (93)
when the job must not be requeued.
`)
	return b.String()
}

// optionHelp renders one option: its spellings, then env and default, then help.
func optionHelp(o *option) string {
	var b strings.Builder
	b.WriteString("  ")
	if o.short != "" {
		fmt.Fprintf(&b, "-%s, ", o.short)
	}
	fmt.Fprintf(&b, "--%s", o.names[0])
	if o.arg != "" && o.kind == kindValue {
		fmt.Fprintf(&b, " %s", o.arg)
	}
	var meta []string
	if envs := o.envNames(); len(envs) > 0 {
		meta = append(meta, "env "+strings.Join(envs, ", "))
	}
	if o.def != "" {
		meta = append(meta, "default "+o.def)
	}
	if len(meta) > 0 {
		fmt.Fprintf(&b, "   [%s]", strings.Join(meta, ", "))
	}
	b.WriteString("\n")
	help := o.help
	if o.deprecated != "" {
		help += " Deprecated and ignored: " + o.deprecated + "."
	}
	for _, line := range wrap(help, 72) {
		fmt.Fprintf(&b, "        %s\n", line)
	}
	return b.String()
}

// wrap breaks s into lines of at most width runes at spaces.
func wrap(s string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		if line != "" && len(line)+1+len(w) > width {
			lines = append(lines, line)
			line = w
			continue
		}
		if line == "" {
			line = w
		} else {
			line += " " + w
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}
