package main

import (
	"log/slog"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/monitor"
	"github.com/ftlauncher/ft-launcher/state"
)

// openState starts the launcher-held state store when --state-dir is set
// (docs/state.md); nil when it is not.
func openState(cfg *configs.Config, ev *eventlog.Log, log *slog.Logger) (*state.Store, error) {
	if cfg.StateDir == "" {
		return nil, nil
	}
	st, err := state.Open(state.Options{NLocal: cfg.NProcPerNode, Dir: cfg.StateDir, Every: cfg.StatePersist,
		Emit: eventFields(ev), Logger: log.With("component", "state")})
	if err != nil {
		return nil, err
	}
	log.Info("state: ranks save into launcher memory", "segments", st.ShmDir(), "dir", cfg.StateDir, "persist_every", cfg.StatePersist.String())
	return st, nil
}

// stateMonitors are the rank monitors as the agent sees them, plus a
// write-out of every new save as soon as a cycle that did not complete has
// ended (a rank failed or hung, a signal stopped the job: walltime), so
// that a continuation job starts from the newest state. Embedding keeps
// every other interface of *monitor.Manager the agent asks for.
type stateMonitors struct {
	*monitor.Manager
	st *state.Store
}

func (m stateMonitors) EndCycleWith(completed bool) {
	m.Manager.EndCycleWith(completed)
	if !completed { // a completed run is written out when the store closes
		m.st.Kick("ranks stopped")
	}
}
