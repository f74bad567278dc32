package monitor

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/internal/atomicfile"
	"github.com/ftlauncher/ft-launcher/monitor/ftwire"
)

// Trust thresholds for timeouts the launcher computes itself (docs/timeouts.md).
const (
	minHeartbeatIntervals = 10 // heartbeat intervals observed in a cycle (over all local ranks)
	minSectionCloses      = 3  // closes of a section observed in a cycle (over all local ranks)
	minOutOfSection       = 3  // out-of-section stretches observed in a cycle
	blendWeight           = 0.5
	stateVersion          = 1
)

// Timeouts are the effective rank timeouts. A zero duration means disabled.
// The *Calculated flags say the value was computed (by the launcher or sent
// by a client), not configured; only computed values are blended with new
// observations.
type Timeouts struct {
	InitialHeartbeat       time.Duration
	Heartbeat              time.Duration
	HeartbeatCalculated    bool
	Sections               map[string]time.Duration // keys are the configured sections; 0 = disabled
	CalculatedSections     map[string]bool
	OutOfSection           time.Duration
	OutOfSectionCalculated bool
}

// Clone returns a deep copy.
func (t Timeouts) Clone() Timeouts {
	t.Sections = maps.Clone(t.Sections)
	t.CalculatedSections = maps.Clone(t.CalculatedSections)
	if t.Sections == nil {
		t.Sections = map[string]time.Duration{}
	}
	if t.CalculatedSections == nil {
		t.CalculatedSections = map[string]bool{}
	}
	return t
}

func durOf(v *float64) time.Duration {
	d, ok := configs.Seconds(v)
	if !ok || d <= 0 || math.IsNaN(*v) || math.IsInf(*v, 0) {
		return 0
	}
	return d
}

func secsOf(d time.Duration) *float64 {
	if d <= 0 {
		return nil
	}
	s := d.Seconds()
	return &s
}

// configuredTimeouts converts the FT config into Timeouts.
func configuredTimeouts(ft *configs.FaultTolerance) Timeouts {
	t := Timeouts{
		InitialHeartbeat: durOf(ft.InitialRankHeartbeatTimeout),
		Heartbeat:        durOf(ft.RankHeartbeatTimeout),
		OutOfSection:     durOf(ft.RankOutOfSectionTimeout),
	}.Clone()
	for name, v := range ft.RankSectionTimeouts {
		t.Sections[name] = durOf(v)
	}
	return t
}

// applyUpdate overlays a client-sent (or persisted) update onto t.
func (t *Timeouts) applyUpdate(u *ftwire.TimeoutsUpdate) {
	if u == nil {
		return
	}
	if hb := u.Heartbeat; hb != nil {
		t.InitialHeartbeat = durOf(hb.Initial)
		t.Heartbeat = durOf(hb.Subsequent)
		t.HeartbeatCalculated = hb.WereCalculated
	}
	if st := u.Section; st != nil {
		calc := map[string]bool{}
		for _, s := range st.CalculatedSections {
			calc[s] = true
		}
		for name, v := range st.Section {
			t.Sections[name] = durOf(v)
			t.CalculatedSections[name] = calc[name]
		}
		t.OutOfSection = durOf(st.OutOfSection)
		t.OutOfSectionCalculated = st.IsOutOfSectionCalculated
	}
}

// toUpdate renders the calculated parts of t in nvrx's state_dict shape:
// heartbeat only when calculated, section only when any section or the
// out-of-section timeout is calculated.
func (t Timeouts) toUpdate() ftwire.TimeoutsUpdate {
	var u ftwire.TimeoutsUpdate
	if t.HeartbeatCalculated {
		u.Heartbeat = &ftwire.HeartbeatTimeouts{
			Initial: secsOf(t.InitialHeartbeat), Subsequent: secsOf(t.Heartbeat), WereCalculated: true,
		}
	}
	var calc []string
	for s, ok := range t.CalculatedSections {
		if ok {
			calc = append(calc, s)
		}
	}
	slices.Sort(calc)
	if len(calc) > 0 || t.OutOfSectionCalculated {
		st := &ftwire.SectionTimeouts{
			Section:                  map[string]*float64{},
			OutOfSection:             secsOf(t.OutOfSection),
			CalculatedSections:       calc,
			IsOutOfSectionCalculated: t.OutOfSectionCalculated,
		}
		if st.CalculatedSections == nil {
			st.CalculatedSections = []string{}
		}
		for s, d := range t.Sections {
			st.Section[s] = secsOf(d)
		}
		u.Section = st
	}
	return u
}

// observations are the per-cycle maxima the monitors measured, over all
// local ranks.
type observations struct {
	InitialDelay    time.Duration            `json:"initial_heartbeat_delay_max"`
	HeartbeatMax    time.Duration            `json:"heartbeat_interval_max"`
	Heartbeats      int64                    `json:"heartbeat_intervals"`
	SectionMax      map[string]time.Duration `json:"section_max"`
	SectionCloses   map[string]int           `json:"section_closes"`
	OutOfSectionMax time.Duration            `json:"out_of_section_max"`
	OutOfSections   int                      `json:"out_of_section_stretches"`
	// CheckpointSeen: the cycle contained a checkpoint or ran to completion
	// (heartbeat and out-of-section timing is trusted only then).
	CheckpointSeen bool `json:"checkpoint_seen"`
}

func (o *observations) merge(p *observations) {
	o.InitialDelay = max(o.InitialDelay, p.InitialDelay)
	o.HeartbeatMax = max(o.HeartbeatMax, p.HeartbeatMax)
	o.Heartbeats += p.Heartbeats
	o.OutOfSectionMax = max(o.OutOfSectionMax, p.OutOfSectionMax)
	o.OutOfSections += p.OutOfSections
	if o.SectionMax == nil {
		o.SectionMax, o.SectionCloses = map[string]time.Duration{}, map[string]int{}
	}
	for s, d := range p.SectionMax {
		o.SectionMax[s] = max(o.SectionMax[s], d)
	}
	for s, n := range p.SectionCloses {
		o.SectionCloses[s] += n
	}
}

func blend(candidate, prev time.Duration, prevCalculated bool) time.Duration {
	if prevCalculated && prev > 0 {
		return time.Duration(blendWeight*float64(candidate) + (1-blendWeight)*float64(prev))
	}
	return candidate
}

// scaled is d times the safety factor (5 when none is set).
func scaled(d time.Duration, safety float64) time.Duration {
	if safety <= 0 {
		safety = 5
	}
	return time.Duration(float64(d) * safety)
}

// change records one timeout the computation replaced, for logging.
type change struct {
	Name          string
	Old, New      time.Duration
	OldCalculated bool
}

// compute folds one cycle's observations into cur and returns the new
// timeouts and what changed. clientSet lists fields a client set this cycle
// ("heartbeat", "oos", "section:<name>"); those are left alone.
// With noHeartbeat the heartbeat timeouts are left alone (the judged
// default clock learns them per cycle).
func compute(cur Timeouts, obs *observations, safety float64, floor time.Duration, clientSet map[string]bool, noHeartbeat bool) (Timeouts, []change) {
	next := cur.Clone()
	var changes []change
	scale := func(d time.Duration) time.Duration { return max(scaled(d, safety), floor) }
	if !noHeartbeat && !clientSet["heartbeat"] && obs.CheckpointSeen && obs.Heartbeats >= minHeartbeatIntervals && obs.HeartbeatMax > 0 && obs.InitialDelay > 0 {
		// The delay before the first heartbeat includes loading a checkpoint,
		// which a fresh start never did: never enable a disabled initial
		// timeout from it, only refine one that is set.
		ni := cur.InitialHeartbeat
		if cur.InitialHeartbeat > 0 {
			ni = blend(scale(obs.InitialDelay), cur.InitialHeartbeat, cur.HeartbeatCalculated)
		}
		nh := blend(scale(obs.HeartbeatMax), cur.Heartbeat, cur.HeartbeatCalculated)
		if ni != cur.InitialHeartbeat {
			changes = append(changes, change{"initial_heartbeat", cur.InitialHeartbeat, ni, cur.HeartbeatCalculated})
		}
		changes = append(changes, change{"heartbeat", cur.Heartbeat, nh, cur.HeartbeatCalculated})
		next.InitialHeartbeat, next.Heartbeat, next.HeartbeatCalculated = ni, nh, true
	}
	for name := range cur.Sections {
		if name == "warmup" || clientSet["section:"+name] {
			continue
		}
		if obs.SectionCloses[name] < minSectionCloses || obs.SectionMax[name] <= 0 {
			continue
		}
		n := blend(scale(obs.SectionMax[name]), cur.Sections[name], cur.CalculatedSections[name])
		changes = append(changes, change{"section:" + name, cur.Sections[name], n, cur.CalculatedSections[name]})
		next.Sections[name] = n
		next.CalculatedSections[name] = true
	}
	if !clientSet["oos"] && obs.CheckpointSeen && len(cur.Sections) > 0 && obs.OutOfSections >= minOutOfSection && obs.OutOfSectionMax > 0 {
		n := blend(scale(obs.OutOfSectionMax), cur.OutOfSection, cur.OutOfSectionCalculated)
		changes = append(changes, change{"out_of_section", cur.OutOfSection, n, cur.OutOfSectionCalculated})
		next.OutOfSection, next.OutOfSectionCalculated = n, true
	}
	return next, changes
}

// stateFile is the persisted JSON: nvrx's state_dict shape plus our metadata.
type stateFile struct {
	CurrentTimeouts ftwire.TimeoutsUpdate `json:"current_timeouts"`
	FTLauncher      *stateMeta            `json:"ft_launcher,omitempty"`
}

type stateMeta struct {
	Version   int          `json:"version"`
	Cycle     int          `json:"cycle"`
	WrittenAt time.Time    `json:"written_at"`
	Observed  *observedOut `json:"observed,omitempty"`
}

// observedOut is observations in seconds, for people reading the file.
type observedOut struct {
	InitialHeartbeatDelay float64            `json:"initial_heartbeat_delay_max_s"`
	HeartbeatIntervalMax  float64            `json:"heartbeat_interval_max_s"`
	HeartbeatIntervals    int64              `json:"heartbeat_intervals"`
	SectionMax            map[string]float64 `json:"section_max_s,omitempty"`
	SectionCloses         map[string]int     `json:"section_closes,omitempty"`
	OutOfSectionMax       float64            `json:"out_of_section_max_s"`
	OutOfSectionStretches int                `json:"out_of_section_stretches"`
}

func observedFor(o *observations) *observedOut {
	out := &observedOut{
		InitialHeartbeatDelay: o.InitialDelay.Seconds(), HeartbeatIntervalMax: o.HeartbeatMax.Seconds(),
		HeartbeatIntervals: o.Heartbeats, OutOfSectionMax: o.OutOfSectionMax.Seconds(),
		OutOfSectionStretches: o.OutOfSections, SectionCloses: o.SectionCloses,
		SectionMax: map[string]float64{},
	}
	for s, d := range o.SectionMax {
		out.SectionMax[s] = d.Seconds()
	}
	return out
}

// loadState reads a persisted state file. A missing file returns (nil, nil).
func loadState(path string) (*ftwire.TimeoutsUpdate, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read timeouts state: %w", err)
	}
	var sf stateFile
	if err := json.Unmarshal(b, &sf); err != nil {
		return nil, fmt.Errorf("parse timeouts state %s: %w", path, err)
	}
	u := sf.CurrentTimeouts
	if hb := u.Heartbeat; hb != nil {
		if !validSecs(hb.Initial) || !validSecs(hb.Subsequent) {
			return nil, fmt.Errorf("timeouts state %s: invalid heartbeat timeouts", path)
		}
	}
	if st := u.Section; st != nil {
		for name, v := range st.Section {
			if v != nil && !validSecs(v) {
				return nil, fmt.Errorf("timeouts state %s: invalid timeout for section %q", path, name)
			}
		}
		if st.OutOfSection != nil && !validSecs(st.OutOfSection) {
			return nil, fmt.Errorf("timeouts state %s: invalid out-of-section timeout", path)
		}
	}
	return &u, nil
}

func validSecs(v *float64) bool {
	return v == nil || (*v > 0 && !math.IsNaN(*v) && !math.IsInf(*v, 0))
}

// saveState writes the state file atomically: readers (other jobs sharing
// it) see the old content or the new, never a torn file.
func saveState(path string, t Timeouts, cycle int, obs *observations) error {
	sf := stateFile{
		CurrentTimeouts: t.toUpdate(),
		FTLauncher:      &stateMeta{Version: stateVersion, Cycle: cycle, WrittenAt: time.Now().UTC()},
	}
	if obs != nil {
		sf.FTLauncher.Observed = observedFor(obs)
	}
	b, err := json.MarshalIndent(sf, "", "  ")
	if err != nil {
		return fmt.Errorf("encode timeouts state: %w", err)
	}
	// 0644: the state file is shared by the jobs that name it (possibly run
	// by other users of a group), and holds nothing secret.
	if err := atomicfile.Write(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("save timeouts state: %w", err)
	}
	return nil
}

// String renders t for logs.
func (t Timeouts) String() string {
	s := fmt.Sprintf("initial_heartbeat=%v heartbeat=%v calculated=%v out_of_section=%v(calculated=%v) sections={",
		t.InitialHeartbeat, t.Heartbeat, t.HeartbeatCalculated, t.OutOfSection, t.OutOfSectionCalculated)
	names := slices.Sorted(maps.Keys(t.Sections))
	for i, n := range names {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%s=%v", n, t.Sections[n])
		if t.CalculatedSections[n] {
			s += "(calculated)"
		}
	}
	return s + "}"
}
