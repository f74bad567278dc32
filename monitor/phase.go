package monitor

import "strconv"

// rankPhase is where one rank monitor is in a cycle. Every change goes
// through (*rankMon).setPhaseLocked, and phaseTransitionOK is the whole
// state machine:
//
//	idle ──► waiting ──► initial ──► heartbeating
//	            ▲           │  ▲          │
//	            └───────────┴──┴──────────┘  disconnected, replaced, re-initialised
//	initial, heartbeating ──► hung (a deadline expired; sticky until the cycle ends)
//	any ──► ended ──► waiting | idle (the next cycle)
//
// Open sections are not phases: a rank may open sections before its first
// heartbeat and hold several at once, so they are a set beside the phase
// (rankMon.open), and "out of section" is that set being empty.
type rankPhase uint32

const (
	phaseIdle         rankPhase = iota // no cycle yet, or no process for this rank this cycle
	phaseWaiting                       // cycle running, no session: not connected yet, or disconnected
	phaseInitial                       // session initialised; the initial heartbeat is pending
	phaseHeartbeating                  // heartbeats arriving; the heartbeat timeout applies
	phaseHung                          // a deadline expired and the rank is being terminated
	phaseEnded                         // the cycle ended; nothing is evaluated
)

func (p rankPhase) String() string {
	switch p {
	case phaseIdle:
		return "idle"
	case phaseWaiting:
		return "waiting-for-session"
	case phaseInitial:
		return "initial-heartbeat-pending"
	case phaseHeartbeating:
		return "heartbeating"
	case phaseHung:
		return "hung"
	case phaseEnded:
		return "ended"
	}
	return "phase(" + strconv.Itoa(int(p)) + ")"
}

// inSession reports a phase whose clocks are evaluated: a client session is
// initialised and no hang has fired.
func (p rankPhase) inSession() bool { return p == phaseInitial || p == phaseHeartbeating }

// phaseTransitionOK lists the legal transitions; anything else is a bug and
// is logged.
func phaseTransitionOK(from, to rankPhase) bool {
	if from == to {
		return true
	}
	switch to {
	case phaseEnded:
		return from != phaseIdle
	case phaseIdle:
		return from == phaseEnded
	case phaseWaiting:
		return from == phaseIdle || from == phaseEnded || from.inSession()
	case phaseInitial:
		return from == phaseWaiting || from.inSession()
	case phaseHeartbeating:
		return from == phaseInitial
	case phaseHung:
		return from.inSession()
	}
	return false
}
