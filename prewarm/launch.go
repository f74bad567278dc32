package prewarm

import (
	"strings"
	"time"

	"github.com/ftlauncher/ft-launcher/spawn"
)

// Standbys at launch: the first cycle of a known command line.
//
// Without them the first cycle's ranks start cold and the standbys start
// once those ranks run, so on a node with few cores a job's start pays the
// ranks' imports and then competes with the standbys' (docs/prewarm.md,
// "The first cycle"). When --prewarm auto already knows what this command
// line's ranks import (an earlier job on this host learned it: the state
// file), Launch starts one standby per local rank as soon as the launcher
// starts, during the first rendezvous, and the first cycle's ranks are
// handed to them: the imports overlap the rendezvous, and nothing imports
// twice. A command line seen for the first time starts cold, as before:
// what its ranks import is not known yet, and a standby of the built-in
// list could import more than they do.

// launchWait bounds a first-cycle rank's wait for its launch standby's
// import. A cold start would begin the same import from nothing, so the
// rank waits rather than start cold; the bound only ends a standby that
// is stuck.
const launchWait = time.Minute

// launchedChoice is what a first-cycle rank does with its launch standby
// still importing: it waits.
func launchedChoice() choice {
	return choice{Wait: true, MaxWait: launchWait,
		Reason: "started at launch for the first cycle; a cold start would begin the same import from nothing"}
}

// Launch starts, at once, a standby for every rank of specs, before the
// node's first round, when --prewarm auto has learned this command line's
// modules (see above); otherwise it does nothing. specs are the ranks the
// node would start, without the values of an assignment it does not have
// yet (as Park's); the handover gives every per-rank value. A node that
// the first round parks as a spare keeps them (Park). It must not block.
func (st *Starter) Launch(specs []spawn.Spec) {
	if len(specs) == 0 || st.auto == nil {
		return
	}
	specs = st.hooked(specs)
	key := st.auto.keyOf(specs[0])
	c := st.auto.learner.Get(key)
	if _, why := warmable(specs[0]); why != "" {
		st.log.Debug("prewarm auto: no standbys at launch: "+why, "local_ranks", len(specs))
		return
	}
	if !c.learned() {
		st.log.Info("prewarm auto: the first cycle starts cold: this command line's imports are not known yet (its standbys start once its ranks run)",
			"state_file", st.auto.learner.Path())
		return
	}
	st.mu.Lock()
	skip := st.closed || st.seen || st.disabled != ""
	st.mu.Unlock()
	if skip {
		return
	}
	modules := st.auto.learner.Modules(key)
	st.log.Info("prewarm auto: starting standbys at launch; the first cycle's ranks start on them",
		"local_ranks", len(specs), "modules", strings.Join(modules, ","), "learned_cycles", c.Cycles,
		"state_file", st.auto.learner.Path())
	for _, sp := range specs {
		st.startStandbyFor(sp, true)
	}
}
