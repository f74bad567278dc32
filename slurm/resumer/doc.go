// Package resumer is ft-resumer's outer loop on Slurm: a chain of batch
// jobs (chain.json under the chain directory), each job's outcome judged
// from the launchers' verdicts and Slurm's record (Judge), the successor
// submitted, held or cancelled, the generated wrapper script and the
// evidence (warning signals, node verdicts) it leaves. It drives Slurm
// through sbatch, scontrol, sacct and scancel (Scheduler).
//
// It builds on package slurm (environment, node lists, node addresses),
// which the launcher uses; the launcher does not import this package.
package resumer
