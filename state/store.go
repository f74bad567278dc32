package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"golang.org/x/sys/unix"
)

// Environment of the ranks (read by ft_launcher_client.state).
const (
	// EnvShmDir is the directory of the segments: the rank's is
	// $FT_STATE_SHM_DIR/rank-$LOCAL_RANK.
	EnvShmDir = "FT_STATE_SHM_DIR"
	// EnvDir is the state directory (--state-dir): the written-out saves,
	// and the client's fallback when a save does not fit in memory.
	EnvDir = "FT_STATE_DIR"
)

// Event kinds of the records the store gives Options.Emit.
const (
	EventSave          = eventlog.StateSave          // StateSaveEvent
	EventPersisted     = eventlog.StatePersisted     // StatePersistedEvent
	EventPersistFailed = eventlog.StatePersistFailed // StatePersistFailedEvent
	EventRestore       = eventlog.StateRestore       // StateRestoreEvent
	EventStaleRemoved  = eventlog.StateStaleRemoved  // StateStaleRemovedEvent
	EventCorrupt       = eventlog.StateCorrupt       // StateCorruptEvent
)

// RestoreNotePattern matches the notes a rank's load() leaves in the
// segments' directory (restore-LOCALRANK-PID-N.json, written to a
// temporary name and renamed): where its state came from. The store
// turns each into a state_restore event and removes it.
const RestoreNotePattern = "restore-*.json"

// restoreNote is a note's content (ft_launcher_client.state.load).
type restoreNote struct {
	LocalRank int                   `json:"local_rank"`
	Rank      int                   `json:"rank"`
	Round     int                   `json:"round"`
	Step      *int64                `json:"step"`   // null: nothing was restored
	Source    *eventlog.StateSource `json:"source"` // memory, file; null: nothing
	LoadMS    float64               `json:"load_ms"`
	At        time.Time             `json:"at"`
	// A peer heal's (ft_launcher_client.heal): what it did (peer, kept,
	// load, fallback), why, the survivor a replacement's state came from,
	// the bytes sent, and when a survivor completed the healed step.
	Heal     eventlog.HealOutcome `json:"heal,omitempty"`
	Why      string               `json:"why,omitempty"`
	FromRank *int                 `json:"from_rank,omitempty"`
	Bytes    int64                `json:"bytes,omitempty"`
	StepAt   *time.Time           `json:"step_at,omitempty"`
	// The damaged sources load() passed over (docs/state.md, "Integrity").
	Rejected []rejectedSource `json:"rejected,omitempty"`
}

// rejectedSource is a damaged source in a restore note.
type rejectedSource struct {
	Source eventlog.StateSource `json:"source"` // memory, file
	Slot   *int                 `json:"slot"`
	Seq    *int64               `json:"seq"`
	Step   *int64               `json:"step"`
	Error  string               `json:"error"`
}

// Every is when the background writer writes: after Saves new saves, or
// when Interval has passed since the last write and there is a new save.
// Both zero: only when a rank fails, on a signal and at the end.
type Every struct {
	Saves    int
	Interval time.Duration
}

// String spells e as --state-persist-every takes it.
func (e Every) String() string {
	if e.Interval > 0 {
		return e.Interval.String()
	}
	return strconv.Itoa(e.Saves)
}

// MaxPersistSaves and MaxPersistInterval bound --state-persist-every.
const (
	MaxPersistSaves    = 1_000_000_000
	MaxPersistInterval = 7 * 24 * time.Hour
)

// ParseEvery reads --state-persist-every: a count of saves ("10") or a
// duration ("90s", "5m"); "0" writes only on failure, signal and end.
func ParseEvery(s string) (Every, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 0 || n > MaxPersistSaves {
			return Every{}, fmt.Errorf("--state-persist-every %q: a count of saves must be 0 to %d", s, MaxPersistSaves)
		}
		return Every{Saves: n}, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 || d > MaxPersistInterval {
		return Every{}, fmt.Errorf("--state-persist-every %q: want a count of saves (0 to %d) or a duration like 90s or 5m (up to 168h)", s, MaxPersistSaves)
	}
	return Every{Interval: d}, nil
}

// Options configure a Store.
type Options struct {
	NLocal int
	// Dir is the state directory the saves are written to.
	Dir string
	// ShmRoot holds the segments' directory; "" means /dev/shm.
	ShmRoot string
	Every   Every
	// Poll is how often the segments' headers are read (a 4 KiB pread
	// each); 0 means 200 ms.
	Poll   time.Duration
	Emit   func(eventlog.Record) // nil: no events (*eventlog.Log's Emit)
	Logger *slog.Logger          // nil: slog.Default

	// onWrite, when set (tests), is called on the thread about to write a
	// save out, with its reason and thread id.
	onWrite func(reason eventlog.PersistReason, tid int)
}

// rankState is what the store knows of one local rank's segment.
type rankState struct {
	seen      uint64 // newest seq observed (events)
	written   uint64 // newest seq written out
	corrupt   uint64 // a seq whose write-out was refused (damaged): not tried again
	savesNew  int    // saves since the last write
	lastWrite time.Time
	dueSince  time.Time // when the pending periodic write-out became due (zero: none)
}

// ReasonOverdue is a periodic write-out that stayed due longer than
// overdueAfter at low priority (a node without an idle core) and was done
// again at the launcher's own priority.
const ReasonOverdue = eventlog.PersistOverdue

// overdueAfter is how long a periodic write-out may stay due at low
// priority before it runs at the launcher's priority: --state-persist-every
// as a duration, a minute for a count of saves. So the file lags memory by
// at most about twice the interval plus one write-out, however busy the
// node (at nice 19 a write-out gets a sliver of a core per busy thread
// beside it: seconds to minutes for a large state).
func (s *Store) overdueAfter() time.Duration {
	if s.opts.Every.Interval > 0 {
		return s.opts.Every.Interval
	}
	return time.Minute
}

// Store owns the segments of one node's local ranks and writes them out in
// the background. The ranks never wait on it: it only reads their
// segments, and a save it races is read again.
type Store struct {
	opts   Options
	shmDir string
	lock   *os.File // the segments' directory's owner lock (stale.go), held until Close
	kick   chan eventlog.PersistReason
	done   chan struct{}
	cancel context.CancelFunc

	closeOnce sync.Once
	closeErr  error

	// low runs the periodic write-outs on a lowered thread (lowprio.go);
	// nil when --state-persist-every is 0 (no periodic write-outs).
	low *lowWriter
	// pmu guards urgent and pcancel: Kick sets urgent and cancels the
	// periodic write-out under way, so that an urgent one never waits for
	// a low-priority one.
	pmu     sync.Mutex
	urgent  bool
	pcancel context.CancelFunc

	mu       sync.Mutex // guards ranks, warnings; held across a write-out
	ranks    []rankState
	warnings []string

	// bmu guards marks and buddies, apart from mu: a round's restore must
	// not wait for a write-out.
	bmu     sync.Mutex
	marks   map[int]BuddyRestore // local rank → the copy its next load() should find
	buddies []BuddyRestore       // the newest maxBuddyRestores, for the verdict
}

// Sources of a restore (state_restore's source).
const (
	SourceMemory = eventlog.SourceMemory // the rank's segment, as the rank's load() reports it
	SourceFile   = eventlog.SourceFile   // the state directory
	// SourceBuddy: the segment, filled before the round with a buddy's copy
	// (RestoreRanks): the store reports the load so, the rank cannot tell.
	SourceBuddy = eventlog.SourceBuddy
)

// BuddyRestore is a local rank's segment filled with a buddy's copy of
// its global rank before a round (RestoreRanks).
type BuddyRestore struct {
	Round     int    `json:"round"`
	LocalRank int    `json:"local_rank"`
	Rank      int32  `json:"rank"`
	Step      int64  `json:"step"`
	Sender    string `json:"sender"` // the node that saved the copy (the lost one)
}

// maxBuddyRestores bounds what the verdict lists.
const maxBuddyRestores = 64

// BuddyRestored records RestoreRanks' restores for a round: each rank's
// first load() of that round that reads that copy's rank and step from
// memory is recorded with source "buddy"; BuddyRestores lists them.
func (s *Store) BuddyRestored(rs ...BuddyRestore) {
	s.bmu.Lock()
	defer s.bmu.Unlock()
	if s.marks == nil {
		s.marks = map[int]BuddyRestore{}
	}
	for _, r := range rs {
		s.marks[r.LocalRank] = r
		s.buddies = append(s.buddies, r)
	}
	if n := len(s.buddies); n > maxBuddyRestores {
		s.buddies = append([]BuddyRestore(nil), s.buddies[n-maxBuddyRestores:]...)
	}
}

// BuddyRestores are the restores from buddies so far (the newest 64),
// for the verdict.
func (s *Store) BuddyRestores() []BuddyRestore {
	s.bmu.Lock()
	defer s.bmu.Unlock()
	return append([]BuddyRestore(nil), s.buddies...)
}

// source is the restore source to record for a rank's note: "buddy" for
// the first load of the round a buddy's copy was restored for, when it
// read that copy from memory; the note's own source otherwise.
func (s *Store) source(n restoreNote) eventlog.StateSource {
	s.bmu.Lock()
	defer s.bmu.Unlock()
	b, ok := s.marks[n.LocalRank]
	if !ok || b.Round != n.Round {
		return *n.Source
	}
	delete(s.marks, n.LocalRank)
	if *n.Source == SourceMemory && int32(n.Rank) == b.Rank && *n.Step == b.Step {
		return SourceBuddy
	}
	return *n.Source
}

// Open removes the segments' directories under ShmRoot that launchers
// killed without their clean-up left behind (RemoveStale), creates its own
// (mode 0700, holding its owner lock) and starts the background writer.
// The segments are created by the ranks' first saves; the directory and
// everything in it stay until Close, so a rank's next process finds the
// saves of the one before.
func Open(opts Options) (*Store, error) {
	if opts.NLocal < 1 {
		return nil, fmt.Errorf("state store: %d local ranks, need at least 1", opts.NLocal)
	}
	if opts.Dir == "" {
		return nil, errors.New("state store: no state directory (--state-dir)")
	}
	if opts.ShmRoot == "" {
		opts.ShmRoot = "/dev/shm"
	}
	if opts.Poll <= 0 {
		opts.Poll = 200 * time.Millisecond
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Emit == nil {
		opts.Emit = func(eventlog.Record) {}
	}
	RemoveStale(opts.ShmRoot, opts.Emit, opts.Logger)
	shm, lock, err := createShmDir(opts.ShmRoot)
	if err != nil {
		return nil, fmt.Errorf("state store: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Store{opts: opts, shmDir: shm, lock: lock, kick: make(chan eventlog.PersistReason, 1), done: make(chan struct{}), cancel: cancel,
		ranks: make([]rankState, opts.NLocal)}
	now := time.Now()
	for i := range s.ranks {
		s.ranks[i].lastWrite = now
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		s.warn(-1, "start", fmt.Errorf("state directory: %w", err))
	} else {
		removeStaleTemps(opts.Dir)
	}
	if opts.Every.Saves > 0 || opts.Every.Interval > 0 {
		s.low = startLowWriter(opts.Logger)
	}
	go s.loop(ctx)
	return s, nil
}

// ShmDir is the segments' directory.
func (s *Store) ShmDir() string { return s.shmDir }

// SegmentPath is the segment of local rank lr.
func (s *Store) SegmentPath(lr int) string {
	return filepath.Join(s.shmDir, "rank-"+strconv.Itoa(lr))
}

// Env is what the ranks need to find their segment and the state directory.
func (s *Store) Env() []string {
	return []string{EnvShmDir + "=" + s.shmDir, EnvDir + "=" + s.opts.Dir}
}

// Kick asks for a write-out of every new save now (a rank failed, the job
// is stopping); it does not wait for it. A periodic write-out under way is
// abandoned (its temporary file removed), and the urgent one runs at the
// launcher's own priority.
func (s *Store) Kick(reason eventlog.PersistReason) {
	s.pmu.Lock()
	s.urgent = true
	if s.pcancel != nil {
		s.pcancel()
	}
	s.pmu.Unlock()
	select {
	case s.kick <- reason:
	default: // one is pending already; it writes every new save too
	}
}

// Warnings are the write-out failures so far, for the verdict.
func (s *Store) Warnings() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.warnings...)
}

// Close stops the background writer, writes out every save not yet
// written (reason "end"), and removes the segments. ctx bounds the final
// write-out; the segments are removed whatever it returns. Later calls
// return the first one's result.
func (s *Store) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.cancel() // also abandons a periodic write-out under way
		<-s.done
		if s.low != nil {
			s.low.stop()
		}
		err := s.flush(ctx, eventlog.PersistEnd, true)
		if rerr := os.RemoveAll(s.shmDir); rerr != nil {
			err = errors.Join(err, fmt.Errorf("remove state segments: %w", rerr))
		}
		_ = s.lock.Close() // after the removal: until then no sweep may take the directory
		s.closeErr = err
	})
	return s.closeErr
}

func (s *Store) loop(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(s.opts.Poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.periodic(ctx)
		case reason := <-s.kick:
			s.pmu.Lock()
			s.urgent = false
			s.pmu.Unlock()
			_ = s.flush(ctx, reason, true)
		}
	}
}

// periodic is a poll: it records the new saves and writes out those due,
// on the lowered thread, under a context that Kick cancels.
func (s *Store) periodic(ctx context.Context) {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.pmu.Lock()
	if s.urgent { // an urgent write-out is pending: it goes first
		cancel()
	}
	s.pcancel = cancel
	s.pmu.Unlock()
	_ = s.flush(pctx, "", false)
	s.pmu.Lock()
	s.pcancel = nil
	s.pmu.Unlock()
}

// flush observes every segment and writes out the new saves that are due
// (all new ones when force). reason "" is the periodic policy.
func (s *Store) flush(ctx context.Context, reason eventlog.PersistReason, force bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.readRestores()
	var errs []error
	for lr := range s.ranks {
		if err := ctx.Err(); err != nil && reason != eventlog.PersistEnd {
			return err
		}
		if err := s.flushRank(ctx, lr, reason, force); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *Store) flushRank(ctx context.Context, lr int, reason eventlog.PersistReason, force bool) error {
	rs := &s.ranks[lr]
	// Open for writing too: the write-out pins the save it copies
	// (copyNewestBy); the store writes nothing else into a segment.
	f, err := os.OpenFile(s.SegmentPath(lr), os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // the rank never saved
	}
	if err != nil {
		return s.warn(lr, reason, fmt.Errorf("open segment: %w", err))
	}
	defer f.Close()
	d, err := Newest(f)
	if errors.Is(err, ErrEmpty) {
		return nil
	}
	if err != nil {
		return s.warn(lr, reason, err)
	}
	if d.Seq > rs.seen {
		n := d.Seq - rs.seen // saves committed since the last look
		if rs.seen == 0 {
			n = 1
		}
		rs.savesNew += int(n)
		rs.seen = d.Seq
		s.opts.Emit(eventlog.StateSaveEvent{LocalRank: lr, Rank: int(d.Rank), Step: d.Step, Seq: int64(d.Seq),
			Bytes: int64(d.Length), SaveMS: float64(d.DurationNS) / 1e6, Saves: int64(n)})
	}
	if d.Seq <= rs.written || d.Seq == rs.corrupt {
		return nil
	}
	due := force
	e := s.opts.Every
	if reason == "" {
		due = (e.Saves > 0 && rs.savesNew >= e.Saves) || (e.Interval > 0 && time.Since(rs.lastWrite) >= e.Interval)
		reason = eventlog.PersistPeriodic
	}
	if !due {
		return nil
	}
	start := time.Now()
	low, wctx := reason == "periodic" && s.low != nil, ctx
	if low {
		if rs.dueSince.IsZero() {
			rs.dueSince = start
		}
		overdue := rs.dueSince.Add(s.overdueAfter())
		if !start.Before(overdue) {
			low, reason = false, ReasonOverdue
		} else {
			var cancel context.CancelFunc
			wctx, cancel = context.WithDeadline(ctx, overdue)
			defer cancel()
		}
	}
	m, ok, err := s.write(wctx, f, reason, rs.written, low)
	if low && err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		// Still not done when it became overdue: again, at the launcher's
		// priority (the partial copy was removed).
		s.opts.Logger.Info("state: a periodic write-out was overdue at low priority; writing it at the launcher's priority",
			"local_rank", lr, "due_for", time.Since(rs.dueSince).Round(time.Millisecond))
		start, reason = time.Now(), ReasonOverdue
		m, ok, err = s.write(ctx, f, reason, rs.written, false)
	}
	if err != nil && (reason == "periodic" || reason == ReasonOverdue) && ctx.Err() != nil {
		return nil // abandoned for an urgent write-out (Kick) or Close: still due
	}
	if ce := (*CorruptError)(nil); errors.As(err, &ce) {
		// Never written: the previous file stays. The rank's next save
		// (into the other slot) is written out as usual.
		rs.corrupt, rs.savesNew, rs.lastWrite, rs.dueSince = ce.Desc.Seq, 0, time.Now(), time.Time{}
		s.opts.Emit(eventlog.StateCorruptEvent{LocalRank: lr, Rank: int(ce.Desc.Rank), By: eventlog.CorruptByWriteOut, Source: SourceMemory,
			Seq: eventlog.Opt(int64(ce.Desc.Seq)), Step: eventlog.Opt(ce.Desc.Step), Error: ce.Error()})
		return s.warn(lr, reason, err)
	}
	if err != nil {
		// Retried at the next due point (or kick), not at every poll.
		rs.savesNew, rs.lastWrite, rs.dueSince = 0, time.Now(), time.Time{}
		return s.warn(lr, reason, err)
	}
	if !ok {
		return nil
	}
	rs.written, rs.savesNew, rs.lastWrite, rs.dueSince = m.Seq, 0, time.Now(), time.Time{}
	s.opts.Emit(eventlog.StatePersistedEvent{LocalRank: lr, Rank: int(m.Rank), Step: m.Step, Seq: int64(m.Seq),
		Bytes: int64(m.Bytes), File: filepath.Join(s.opts.Dir, m.File), Reason: reason,
		WriteMS: float64(time.Since(start).Microseconds()) / 1000})
	return nil
}

// write writes f's newest save out: with low on the lowered thread, else
// on the calling goroutine's thread, which is at the launcher's priority
// (only the lowered thread is lowered, and it never runs anything else).
func (s *Store) write(ctx context.Context, f *os.File, reason eventlog.PersistReason, prev uint64, low bool) (m Manifest, ok bool, err error) {
	run := func() {
		runtime.LockOSThread() // onWrite's thread id stays this write's thread
		defer runtime.UnlockOSThread()
		if s.opts.onWrite != nil {
			s.opts.onWrite(reason, unix.Gettid())
		}
		m, ok, err = PersistContext(ctx, f, s.opts.Dir, prev)
	}
	if low {
		s.low.do(run)
	} else {
		run()
	}
	return m, ok, err
}

// readRestores turns the ranks' restore notes into state_restore events
// (one directory read per poll; the ranks write a note per load()). A note
// that does not parse is logged and removed: it only leaves the report
// without one restore's source.
func (s *Store) readRestores() {
	paths, _ := filepath.Glob(filepath.Join(s.shmDir, RestoreNotePattern))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		_ = os.Remove(p)
		var n restoreNote
		if err == nil {
			err = json.Unmarshal(b, &n)
		}
		if err != nil {
			s.opts.Logger.Warn("state: unreadable restore note", "path", p, "err", err)
			continue
		}
		e := eventlog.StateRestoreEvent{LocalRank: n.LocalRank, Rank: n.Rank, Round: n.Round, LoadMS: n.LoadMS, At: n.At}
		if n.Step != nil && n.Source != nil {
			e.Step, e.Source = n.Step, eventlog.Opt(s.source(n))
		}
		if n.Heal != "" { // a peer heal's note (ft_launcher_client.heal)
			e.Heal, e.Why, e.FromRank, e.Bytes, e.StepAt = n.Heal, n.Why, n.FromRank, n.Bytes, n.StepAt
		}
		for _, r := range n.Rejected {
			s.corruptOnLoad(n, e, r)
		}
		s.opts.Emit(e)
	}
}

// corruptOnLoad records a damaged source a rank's load() passed over: an
// event, a log warning and a verdict warning.
func (s *Store) corruptOnLoad(n restoreNote, e eventlog.StateRestoreEvent, r rejectedSource) {
	c := eventlog.StateCorruptEvent{LocalRank: n.LocalRank, Rank: n.Rank, By: eventlog.CorruptByLoad, Source: r.Source, Slot: r.Slot,
		Seq: r.Seq, Step: r.Step, Error: r.Error, UsedSource: e.Source, UsedStep: e.Step}
	s.opts.Emit(c)
	used := "nothing intact was left: the load failed"
	if e.Source != nil && e.Step != nil {
		used = fmt.Sprintf("restored step %d from %s instead", *e.Step, *e.Source)
	}
	what := "a save"
	if r.Seq != nil && r.Step != nil {
		what = fmt.Sprintf("save %d (step %d)", *r.Seq, *r.Step)
	}
	s.opts.Logger.Warn("state: a rank's load found a damaged save", "local_rank", n.LocalRank, "rank", n.Rank,
		"source", r.Source, "seq", r.Seq, "step", r.Step, "err", r.Error, "used", used)
	s.addWarning(fmt.Sprintf("state load (local rank %d, rank %d): %s in %s is damaged (%s); %s",
		n.LocalRank, n.Rank, what, r.Source, r.Error, used))
}

// warn records a write-out failure: an event, a log line and a verdict
// warning. The save stays in memory; the next write-out tries again.
func (s *Store) warn(lr int, reason eventlog.PersistReason, err error) error {
	if reason == "" {
		reason = eventlog.PersistPeriodic
	}
	s.opts.Emit(eventlog.StatePersistFailedEvent{LocalRank: lr, Reason: reason, Error: err.Error()})
	s.opts.Logger.Warn("state: writing the saved state out failed; the copy in memory is kept", "local_rank", lr, "reason", reason, "err", err)
	s.addWarning(fmt.Sprintf("state write-out (local rank %d, %s): %v", lr, reason, err))
	return err
}

// addWarning adds a line to the verdict's state warnings (at most 16);
// s.mu is held.
func (s *Store) addWarning(w string) {
	const maxWarnings = 16
	if len(s.warnings) < maxWarnings {
		s.warnings = append(s.warnings, w)
	}
}
