package verdict

// CloseExitCode is the exit code of a job closed with kind k by the
// restart policy (through the rendezvous): the no-restart code for
// NoRestart, so that an outer loop that sees only the code does not
// restart the job, and 1 (torchrun's failure; configs.ExitFailure) for
// every other kind. An agent that closes the job itself for a rank's
// ShutdownWorkload uses its configured --ft-no-restart-exit-code instead.
func CloseExitCode(k Kind) int {
	if k == NoRestart {
		return DefaultNoRestartExitCode
	}
	return 1
}

// CloseKindOf is the kind of a close record that carries only its exit
// code (written by a launcher older than the close kinds): 0 succeeded,
// the default no-restart code no_restart, anything else fatal_error.
func CloseKindOf(code int) Kind {
	switch code {
	case 0:
		return Succeeded
	case DefaultNoRestartExitCode:
		return NoRestart
	}
	return FatalError
}
