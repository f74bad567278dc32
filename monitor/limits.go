package monitor

import (
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/monitor/ftwire"
)

// Limits on what one rank may make the launcher hold (docs/protocol.md,
// "Limits"). They bound memory and log volume against a buggy or hostile
// rank; real integrations stay far below them.
const (
	// MaxClientTimeout bounds every timeout a rank sends; 0, negative, NaN,
	// ±Inf and larger values (1e300) are refused, so a rank cannot switch
	// detection off. A positive value below MinClientTimeout (a client's
	// safety factor × a few microseconds) is raised to it.
	MinClientTimeout = time.Millisecond
	MaxClientTimeout = 7 * 24 * time.Hour
	// MaxSectionNames bounds the distinct section names one rank may use in
	// a cycle (and the section ids one native session may define).
	MaxSectionNames = 1024
	// MaxSectionNameLen bounds one section name, in bytes.
	MaxSectionNameLen = 256
	// maxPendingPeers bounds the connections waiting for the peer check at
	// once (per launcher); more are refused at once.
	maxPendingPeers = 64
	// refusedLogBurst refused connections are logged one by one; after that
	// at most one summary line per refusedLogEvery.
	refusedLogBurst = 5
	refusedLogEvery = 10 * time.Second
)

// clientSecs converts one client-sent timeout. nil means "leave unchanged";
// a present value must be finite, positive and at most MaxClientTimeout.
func clientSecs(v *float64) (time.Duration, bool, error) {
	if v == nil {
		return 0, false, nil
	}
	f := *v
	if math.IsNaN(f) || math.IsInf(f, 0) || f <= 0 || f > MaxClientTimeout.Seconds() {
		return 0, false, fmt.Errorf("timeout %v s outside (0, %v]", f, MaxClientTimeout)
	}
	if f < MinClientTimeout.Seconds() {
		return MinClientTimeout, true, nil
	}
	d, ok := configs.Seconds(v)
	if !ok {
		return 0, false, fmt.Errorf("timeout %v s not representable", f)
	}
	return d, true, nil
}

// clientUpdate is a validated client update: only the fields present.
type clientUpdate struct {
	fields          map[string]time.Duration // "initial", "heartbeat", "oos", "section:<name>"
	hbCalc, hbSet   bool
	secCalc         map[string]bool
	oosCalc, secSet bool
}

// validateUpdate checks u against the rules of docs/timeouts.md ("Timeouts
// sent by ranks"): every value finite and in bounds, sections only among the
// configured ones.
func validateUpdate(u *ftwire.TimeoutsUpdate, configured map[string]time.Duration) (*clientUpdate, error) {
	cu := &clientUpdate{fields: map[string]time.Duration{}, secCalc: map[string]bool{}}
	put := func(key string, v *float64) error {
		d, ok, err := clientSecs(v)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		if ok {
			cu.fields[key] = d
		}
		return nil
	}
	if hb := u.Heartbeat; hb != nil {
		cu.hbSet, cu.hbCalc = true, hb.WereCalculated
		if err := put("initial", hb.Initial); err != nil {
			return nil, err
		}
		if err := put("heartbeat", hb.Subsequent); err != nil {
			return nil, err
		}
	}
	if st := u.Section; st != nil {
		cu.secSet, cu.oosCalc = true, st.IsOutOfSectionCalculated
		if len(st.Section) > MaxSectionNames || len(st.CalculatedSections) > MaxSectionNames {
			return nil, fmt.Errorf("%d sections, more than %d", len(st.Section), MaxSectionNames)
		}
		for name, v := range st.Section {
			if _, ok := configured[name]; !ok {
				return nil, fmt.Errorf("section %.64q is not configured", name)
			}
			if err := put("section:"+name, v); err != nil {
				return nil, err
			}
		}
		for _, name := range st.CalculatedSections {
			if _, ok := configured[name]; !ok {
				return nil, fmt.Errorf("calculated section %.64q is not configured", name)
			}
			cu.secCalc[name] = true
		}
		if err := put("oos", st.OutOfSection); err != nil {
			return nil, err
		}
	}
	return cu, nil
}

// get and set address one field of Timeouts by its clientUpdate key.
func (t *Timeouts) get(key string) time.Duration {
	switch key {
	case "initial":
		return t.InitialHeartbeat
	case "heartbeat":
		return t.Heartbeat
	case "oos":
		return t.OutOfSection
	}
	return t.Sections[key[len("section:"):]]
}

func (t *Timeouts) set(key string, d time.Duration, calculated bool) {
	switch key {
	case "initial":
		t.InitialHeartbeat = d
	case "heartbeat":
		t.Heartbeat, t.HeartbeatCalculated = d, calculated
	case "oos":
		t.OutOfSection, t.OutOfSectionCalculated = d, calculated
	default:
		name := key[len("section:"):]
		t.Sections[name], t.CalculatedSections[name] = d, calculated
	}
}

func (cu *clientUpdate) calculated(key string) bool {
	switch key {
	case "initial", "heartbeat":
		return cu.hbCalc
	case "oos":
		return cu.oosCalc
	}
	return cu.secCalc[key[len("section:"):]]
}

// applyTo sets the fields present in cu on t (the sender's own timeouts).
func (cu *clientUpdate) applyTo(t *Timeouts) {
	for k, d := range cu.fields {
		t.set(k, d, cu.calculated(k))
	}
}

// tighter returns the stricter of two timeouts (0 = disabled = loosest).
func tighter(a, b time.Duration) time.Duration {
	switch {
	case a <= 0:
		return b
	case b <= 0:
		return a
	}
	return min(a, b)
}

// onceSet remembers which keys were logged, so a hostile rank sending the
// same refused message in a loop produces one line.
type onceSet struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (o *onceSet) first(key string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.seen == nil {
		o.seen = map[string]bool{}
	}
	if o.seen[key] {
		return false
	}
	o.seen[key] = true
	return true
}

// logLimiter logs the first refusedLogBurst events, then at most one
// summary per refusedLogEvery with the count of the events it held back.
type logLimiter struct {
	mu         sync.Mutex
	n          int
	suppressed int
	last       time.Time
}

func (l *logLimiter) log(log *slog.Logger, msg string, args ...any) {
	l.mu.Lock()
	l.n++
	now := time.Now()
	switch {
	case l.n <= refusedLogBurst:
	case now.Sub(l.last) >= refusedLogEvery:
		args = append(args, "suppressed_since_last", l.suppressed)
		l.suppressed = 0
	default:
		l.suppressed++
		l.mu.Unlock()
		return
	}
	l.last = now
	l.mu.Unlock()
	log.Warn(msg, args...)
}
